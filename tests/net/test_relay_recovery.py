"""A relay that goes away and comes back, or has no room: its nodes use it again by themselves."""

from __future__ import annotations

import logging

from node import const
from node.net import Frame, FrameType
from node.net._relay import Circuit
from tests.support.waiting import wait_until

from .test_relay import echo, relayed
from .util import addr


async def test_relayed_peers_link_again_as_soon_as_a_restarted_relay_is_back(make_manager, fast_net,
                                                                            monkeypatch):
    """The relay restarts (same identity and port) while A and B talk through it. Their redial
    backoff has grown meanwhile (here: 120 s from the first failure); once both are registered at
    the returned relay they link again at once, not when that backoff runs out. Before, a
    relay's list only dialled nodes it named for the first time, so a real node waited up to
    RECONNECT_BACKOFF_MAX_S (30 s, ±20 %) after the relay was back (seen: 11-16 s)."""
    monkeypatch.setattr(const, "PEX_INTERVAL_S", 0.3)
    r = await make_manager("r", relay=True)
    port = r.listen_port
    a = await make_manager("a", relays=[addr(r)], no_direct=True)
    b = await make_manager("b", relays=[addr(r)], no_direct=True)
    b.register_handler(FrameType.WORK, echo)
    await wait_until(lambda: relayed(a, b), what="a and b linked through the relay")
    # everything the relay's PEX can tell them about each other is known before it goes (a PEX
    # naming a new address or relay dials at once, and would hide what this test is about)
    await wait_until(lambda: a.table.get(b.node_id).addrs and b.table.get(a.node_id).addrs,
                     what="a and b know each other's addresses from the relay's PEX")
    monkeypatch.setattr(const, "RECONNECT_BACKOFF_MIN_S", 120.0)
    monkeypatch.setattr(const, "RECONNECT_BACKOFF_MAX_S", 120.0)
    await r.async_stop()
    await wait_until(lambda: a.link(b.node_id) is None and b.link(a.node_id) is None,
                     what="the relayed link to drop with the relay")
    # the same relay again: it dials a and b from its peers.json, they register, then list
    r2 = await make_manager("r", relay=True, peer_port=port)
    await wait_until(lambda: {a.node_id, b.node_id} <= set(r2.relay.registrations), timeout_s=20,
                     what="a and b registered at the returned relay")
    await wait_until(lambda: relayed(a, b), timeout_s=20, what="a and b linked through the relay again")
    reply = await a.async_request(b.node_id, Frame(FrameType.WORK, {}, b"again"), timeout_s=10)
    assert reply.payload == b"again"


async def test_a_node_a_full_relay_refused_registers_once_there_is_room(make_manager, fast_net,
                                                                       monkeypatch, caplog):
    """A relay at RELAY_MAX_REGISTRATIONS refuses A with a reason A logs (WARNING, relay_full);
    A asks again while its link to the relay lasts and registers once a place is free. Before,
    A asked once and stayed unregistered (unreachable through that relay) until its link to the
    relay happened to drop."""
    caplog.set_level(logging.INFO, logger="node.net")
    monkeypatch.setattr(const, "RELAY_MAX_REGISTRATIONS", 1)
    monkeypatch.setattr(const, "RELAY_REGISTER_RETRY_S", 0.2, raising=False)
    r = await make_manager("r", relay=True)
    b = await make_manager("b", relays=[addr(r)], no_direct=True)
    await wait_until(lambda: b.node_id in r.relay.registrations, what="b registered")
    a = await make_manager("a", relays=[addr(r)], no_direct=True)
    refusals = lambda: [rec for rec in caplog.records  # noqa: E731
                        if "relay registration failed" in rec.getMessage() and "relay_full" in rec.getMessage()]
    await wait_until(refusals, what="a told the relay is full")
    assert addr(r) not in a.discovery.registered_relays()
    await b.async_stop()
    await wait_until(lambda: a.node_id in r.relay.registrations and addr(r) in a.discovery.registered_relays(),
                     timeout_s=10, what="a registered once b left")
    assert a.link(r.node_id) is not None
    assert refusals()[0].levelno == logging.WARNING  # a user sees why, once; the retries are DEBUG


async def test_a_relay_that_refuses_a_circuit_is_named_in_the_peer_error(make_manager, fast_net):
    """A relay at RELAY_MAX_CIRCUITS (or whose target left) refuses a circuit: the error `swarmllm
    peers` and the diagnostics report show for the peer names that relay and its reason. Before
    it read "peer refused: too_many_circuits", as if the peer had refused, and with several
    relays in --relays nobody could tell which one was full."""
    r = await make_manager("r", relay=True)
    others = [f"{i:064x}" for i in range(const.RELAY_MAX_CIRCUITS)]  # other members' circuits: full
    r.relay.circuits.update({f"held-{i}": Circuit(f"held-{i}", m, m) for i, m in enumerate(others)})
    a = await make_manager("a", relays=[addr(r)], no_direct=True)
    b = await make_manager("b", relays=[addr(r)], no_direct=True)

    def refused():  # (a dial that raced a registration fails as "not registered" first)
        errors = [s.last_error for s in (a.peer(b.node_id), b.peer(a.node_id)) if s is not None]
        return next((e for e in errors if e and "too_many_circuits" in e), None)
    error = await wait_until(refused, what="a dial through the full relay refused")
    assert error == f"relay {addr(r)} refused the circuit: too_many_circuits"


async def test_a_no_direct_node_uses_a_relay_it_knows_only_from_peers_json(make_manager, fast_net):
    """A node met relay R and plain peer P directly, then restarts with --no-direct and no --relays:
    R (peers.json says it is a relay) is dialled directly, as relays always are, and P shows why it
    is not dialled. Before, peers.json did not say R was a relay, so --no-direct dialled neither and
    both showed "connecting" for ever in `swarmllm peers` and the GUI."""
    r = await make_manager("r", relay=True)
    p = await make_manager("p")
    a = await make_manager("a", bootstrap=[addr(r), addr(p)])
    await wait_until(lambda: a.link(r.node_id) and a.link(p.node_id), what="a linked to r and p")
    await a.async_stop()
    await p.async_stop()  # (a running p could dial a2 itself once r's PEX names a2)
    a2 = await make_manager("a", no_direct=True)  # same data dir: peers.json names r and p
    await wait_until(lambda: a2.link(r.node_id) is not None, timeout_s=10, what="a dials the cached relay")
    assert a2.peer(r.node_id).state == "connected" and a2.peer(r.node_id).transport == "direct"
    await wait_until(lambda: addr(r) in a2.discovery.registered_relays(), what="a registered at r")
    await wait_until(lambda: a2.peer(p.node_id).state == "gone", what="p shown as not dialled")
    assert "--no-direct" in a2.peer(p.node_id).last_error


async def test_a_nated_node_reaches_a_returning_configured_relay_without_a_long_backoff(make_manager, fast_net,
                                                                                        monkeypatch):
    """A --no-direct node's configured relay goes away and comes back (same port). The node redials
    a relay at most RELAY_RECONNECT_BACKOFF_MAX_S apart, not RECONNECT_BACKOFF_MAX_S: before, after a
    long outage a NATed node (nobody can dial it; the relay is its only way in) waited up to 36 s
    (30 s ±20 %) after the relay was back. Here the peers' backoff is 30 s from the first failure."""
    r = await make_manager("r", relay=True)
    port = r.listen_port
    a = await make_manager("a", relays=[addr(r)], no_direct=True)
    await wait_until(lambda: addr(r) in a.discovery.registered_relays(), what="a registered at r")
    monkeypatch.setattr(const, "RECONNECT_BACKOFF_MIN_S", 30.0)
    monkeypatch.setattr(const, "RECONNECT_BACKOFF_MAX_S", 30.0)
    monkeypatch.setattr(const, "RELAY_RECONNECT_BACKOFF_MAX_S", 0.3, raising=False)
    await r.async_stop()
    target = a.discovery.dialer.targets[addr(r)]
    await wait_until(lambda: target.failures >= 1, what="a's first redial of the relay failed")
    (r.config.data_dir / "peers.json").unlink()  # a is behind a NAT: the relay cannot dial it back
    r2 = await make_manager("r", relay=True, peer_port=port)
    await wait_until(lambda: a.node_id in r2.relay.registrations, timeout_s=10,
                     what="a registered at the returned relay")
