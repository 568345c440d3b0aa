"""Finding peers and their coming and going, between real PeerManagers on 127.0.0.1: bootstrap,
PEX, the peer cache, a peer gone and back, forgotten, HELLO updates and the observers."""

from __future__ import annotations

import json
import logging
import time

from tests.support.waiting import wait_until

from .util import addr, linked


async def test_bootstrap_discovery(make_manager, fast_net, caplog):
    caplog.set_level(logging.INFO)
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b), what="bootstrap link")
    peer = b.peer(a.node_id)
    assert peer.state == "connected" and peer.transport == "direct"
    assert peer.address == addr(a) and "bootstrap" in peer.sources
    assert a.peer(b.node_id).is_dialer is False
    await wait_until(lambda: b.peer(a.node_id).rtt_ms is not None, what="an RTT sample")
    text = caplog.text
    assert f"DIAG: connection established peer_id={a.short_id}" in text
    assert "is_loopback=True is_dialer=True transport=direct total_established=1" in text
    d = b.peer(a.node_id).as_dict()
    assert {"node_id", "short_id", "state", "transport", "address", "rtt_ms", "rto_ms", "models",
            "last_seen"} <= set(d)


async def test_peer_gone_and_back(make_manager, fast_net, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    port, b_id = b.listen_port, b.node_id
    await b.async_stop()
    await wait_until(lambda: a.peer(b_id).state == "gone", what="a marks b gone")
    assert "DIAG: connection closed" in caplog.text and "DIAG: peer gone" in caplog.text
    b2 = await make_manager("b", peer_port=port)  # same data dir: same identity, same port
    assert b2.node_id == b_id
    await wait_until(lambda: linked(a, b2), what="b back")
    assert a.peer(b_id).state == "connected"


async def test_pex_introduces_peers(make_manager, fast_net):
    hub = await make_manager("hub")
    a = await make_manager("a", bootstrap=[addr(hub)])
    await wait_until(lambda: linked(a, hub))
    c = await make_manager("c", bootstrap=[addr(hub)])
    await wait_until(lambda: linked(c, hub))
    await wait_until(lambda: linked(a, c), what="a and c meet through PEX from the hub")
    assert "pex" in a.peer(c.node_id).sources or "pex" in c.peer(a.node_id).sources


async def test_peer_cache_is_used_at_start_up(make_manager, fast_net, caplog):
    caplog.set_level(logging.DEBUG, logger="node.net")
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    await b.async_stop()
    assert "DIAG: peer cache saved count=1" in caplog.text
    cache = (b.config.data_dir / "peers.json").read_text()
    assert a.node_id in cache
    b2 = await make_manager("b")  # no bootstrap this time
    await wait_until(lambda: linked(a, b2), what="b redials a from peers.json")
    assert "cache" in b2.peer(a.node_id).sources


async def test_hello_announce_updates_models_and_observers(make_manager, fast_net):
    a = await make_manager("a", start=False)
    models = [{"model_id": "m1", "layers": [0, 4], "n_layers": 8, "hash": "h1"}]
    a._models_provider = lambda: models
    a._hardware_provider = lambda: {"device": "cpu", "free_mb": 123, "ms_per_layer": 1.5}
    await a.async_start()
    b = await make_manager("b")
    events: list[tuple[str, str, str]] = []
    unsubscribe = b.subscribe(lambda kind, snap: events.append((kind, snap.short_id, snap.state)))
    await b.async_connect(addr(a), a.node_id)
    await wait_until(lambda: b.peer(a.node_id) and b.peer(a.node_id).models)
    assert b.peer(a.node_id).models[0]["model_id"] == "m1"
    assert b.peer(a.node_id).hardware["ms_per_layer"] == 1.5
    assert ("added", a.short_id, "connecting") in events
    assert ("changed", a.short_id, "connected") in events
    models.append({"model_id": "m2", "layers": [4, 8], "n_layers": 8, "hash": "h2"})
    await a.async_announce()
    await wait_until(lambda: len(b.peer(a.node_id).models) == 2, what="HELLO update")
    unsubscribe()
    n = len(events)
    still: list[tuple[str, int]] = []  # an observer that stays: proves the next HELLO was delivered
    b.subscribe(lambda kind, snap: still.append((kind, len(snap.models))))
    models.append({"model_id": "m3", "layers": [0, 8], "n_layers": 8, "hash": "h3"})
    await a.async_announce()
    await wait_until(lambda: ("changed", 3) in still, what="the next HELLO update reaching b's observers")
    assert len(events) == n  # the unsubscribed observer was not called for it


async def test_observer_failure_does_not_break_the_network(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b")

    def broken(kind, snap):
        raise RuntimeError("observer bug")

    b.subscribe(broken)
    await b.async_connect(addr(a), a.node_id)
    await wait_until(lambda: linked(a, b))


async def test_forgotten_peer_is_removed(make_manager, fast_net, monkeypatch):
    from node import const

    monkeypatch.setattr(const, "PEER_FORGET_S", 0.5)
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    events: list[str] = []
    b.subscribe(lambda kind, snap: events.append(kind))
    b.config.bootstrap = []
    b.discovery.dialer.targets.clear()
    a_id = a.node_id
    await a.async_stop()
    await wait_until(lambda: b.peer(a_id) is None, what="a forgotten after PEER_FORGET_S")
    assert "removed" in events


async def test_self_dial_is_recognised(make_manager, fast_net, caplog):
    caplog.set_level(logging.INFO)
    a = await make_manager("a")
    a.discovery.dialer.add_target(addr(a), "bootstrap")
    a.discovery.dialer.wake()
    await wait_until(lambda: "bootstrap address is this node" in caplog.text)
    assert a.connection_count() == 0 and not a.peers()


async def test_a_new_address_is_learnt_when_sixteen_old_ones_are_known(make_manager, fast_net):
    """A peer that moved often (Wi-Fi roams, DHCP renewals; peers.json keeps them all) has a full
    list of dead addresses here: the address PEX then tells us must be kept and dialled. It was
    appended and cut off at once (the list keeps 16), so the peer stayed unreachable (2026-12-06).
    a dials nobody (no_direct), so only b's dial can link them."""
    a = await make_manager("a", no_direct=True)
    b = await make_manager("b", start=False)
    stale = [f"127.0.0.{i}:{a.listen_port}" for i in range(2, 18)]  # 16 dead loopback addresses
    (b.config.data_dir / "peers.json").write_text(json.dumps({"version": 1, "foreign": [], "peers": [
        {"node_id": a.node_id, "addrs": stale, "relays": [], "last_seen": time.time()}]}))
    hub = await make_manager("hub", bootstrap=[addr(a)])
    await wait_until(lambda: linked(hub, a), what="hub links to a")
    b.config.bootstrap = [addr(hub)]
    await b.async_start()
    await wait_until(lambda: linked(b, a), 20, what="b to reach a at the address PEX told it")
    assert b.peer(a.node_id).address == addr(a)
