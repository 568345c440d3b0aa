"""Peer links between real PeerManagers on 127.0.0.1 (one process, real TCP + TLS 1.3)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from node.errors import InvalidRequest, PeerError, PeerIdentityMismatch, RequestTimeout
from node.net import Frame, FrameType, PeerManager
from node.net._frames import frame_bytes
from tests.support.waiting import wait_until

from .tlsprobe import TlsProbe
from .util import addr


def linked(a: PeerManager, b: PeerManager) -> bool:
    return a.link(b.node_id) is not None and b.link(a.node_id) is not None


async def echo(link, frame):
    return frame.reply(FrameType.RESULT, {"echo": True}, frame.payload)


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


async def test_request_response_errors_and_unknown_types(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))

    async def refuse(link, frame):
        raise InvalidRequest("no such session", code="no_session")

    a.register_handler(FrameType.WORK, echo)
    a.register_handler(FrameType.ACK, refuse)
    reply = await b.async_request(a.node_id, Frame(FrameType.WORK, {"n": 1}, b"\x00\x01" * 4096), timeout_s=10)
    assert reply.type == FrameType.RESULT and reply.payload == b"\x00\x01" * 4096
    with pytest.raises(PeerError) as info:
        await b.async_request(a.node_id, Frame(FrameType.ACK, {}), timeout_s=10)
    assert info.value.code == "no_session"
    for ftype in (FrameType.CANCEL, 200):  # known without a handler, and unknown: ERROR, link stays
        with pytest.raises(PeerError) as info:
            await b.async_request(a.node_id, Frame(ftype, {}), timeout_s=10)
        assert info.value.code == "unsupported_frame_type"
    assert linked(a, b) and a.connection_count() == 1
    with pytest.raises(ValueError):
        a.register_handler(FrameType.PING, echo)


async def test_request_timeout_and_fire_and_forget(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    got: list[Frame] = []
    release = asyncio.Event()

    async def slow(link, frame):
        got.append(frame)
        await release.wait()
        return frame.reply(FrameType.RESULT)

    a.register_handler(FrameType.WORK, slow)
    with pytest.raises(RequestTimeout):
        await b.async_request(a.node_id, Frame(FrameType.WORK), timeout_s=0.2)
    await b.async_send(a.node_id, Frame(FrameType.WORK, {"fire": 1}))
    await wait_until(lambda: len(got) == 2)
    assert got[1].request_id == 0
    release.set()


async def test_ordered_handlers_run_in_arrival_order(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    seen: list[int] = []

    async def work(link, frame):
        if frame.header["i"] == 0:
            await asyncio.sleep(0.2)  # the first one is slow: the others must still wait for it
        seen.append(frame.header["i"])

    a.register_handler(FrameType.WORK, work, ordered=True)
    for i in range(5):
        await b.async_send(a.node_id, Frame(FrameType.WORK, {"i": i}))
    await wait_until(lambda: len(seen) == 5)
    assert seen == [0, 1, 2, 3, 4]


async def test_wrong_identity_is_refused(make_manager, fast_net, caplog):
    caplog.set_level(logging.DEBUG, logger="node.net")
    a = await make_manager("a")
    c = await make_manager("c")
    b = await make_manager("b")
    with pytest.raises(PeerIdentityMismatch):
        await b.async_connect(addr(a), c.node_id)  # a answers at that address, but we wanted c
    assert b.link(a.node_id) is None and b.link(c.node_id) is None
    # a's side of that connection has ended (b hung up before its HELLO), so a could have counted a link
    # by now, and did not: b told the impostor nothing
    await wait_until(lambda: "DIAG: inbound connection closed during set-up" in caplog.text,
                     what="a to see the refused connection end")
    assert "DIAG: connection established" not in caplog.text
    assert a.connection_count() == 0 and b.connection_count() == 0 and a.peer(b.node_id) is None
    assert (await b.async_connect(addr(a), a.node_id)).node_id == a.node_id  # the right identity links
    await wait_until(lambda: a.connection_count() == 1, what="a to count b's link")
    assert (await b.async_connect(addr(a), a.node_id)).node_id == a.node_id


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


async def test_inline_handlers_reply_refuse_and_keep_order(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    seen: list[int] = []

    def ack(link, frame):  # a plain function: called by the reader, no task
        if frame.header.get("bad"):
            raise InvalidRequest("bad ack", code="bad_ack")
        seen.append(frame.header["i"])
        return frame.reply(FrameType.RESULT, {"i": frame.header["i"]})

    a.register_handler(FrameType.ACK, ack)
    for i in range(5):
        await b.async_send(a.node_id, Frame(FrameType.ACK, {"i": i}))
    reply = await b.async_request(a.node_id, Frame(FrameType.ACK, {"i": 5}), timeout_s=10)
    assert reply.header == {"i": 5} and seen == [0, 1, 2, 3, 4, 5]
    with pytest.raises(PeerError) as info:
        await b.async_request(a.node_id, Frame(FrameType.ACK, {"bad": 1}), timeout_s=10)
    assert info.value.code == "bad_ack"


async def test_peer_port_in_use_is_a_clear_error(make_manager):
    from node.errors import NodeError

    a = await make_manager("a")
    b = await make_manager("b", start=False, peer_port=a.listen_port)
    with pytest.raises(NodeError, match="--peer-port") as info:
        await b.async_start()
    assert info.value.code == "peer_port_unavailable"


async def test_server_refuses_a_certificate_other_than_the_announced_one(make_manager, fast_net, tmp_path):
    """The dialler announces certificate X in the preamble but presents Y in TLS: refused."""
    import ssl

    from node.net import Identity
    from node.net._preamble import read_reply, tls_preamble
    from node.net._stream import open_stream
    from node.net._tls import TlsConfig

    a = await make_manager("a")
    honest, liar = TlsConfig(Identity.generate(), tmp_path / "x"), TlsConfig(Identity.generate(), tmp_path / "y")
    honest.prepare()
    liar.prepare()
    stream = await open_stream("127.0.0.1", a.listen_port)
    stream.write(tls_preamble(honest.cert_der))  # announce X ...
    await read_reply(stream)
    async def handshake_then_read():
        await stream.start_tls(liar.client_context(), server_side=False)  # ... present Y
        stream.write(b"\x00" * 24)
        await stream.read_exactly(24)  # TLS 1.3: the client learns of the refusal on its next read

    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await handshake_then_read()
    stream.abort()
    assert a.connection_count() == 0 and not a.peers()


async def test_close_sends_close_notify_before_the_fin(make_manager, fast_net, tmp_path):
    """Read at the TLS level by a probe peer: a node's close() ends TLS with a close_notify alert,
    not with a bare TCP FIN (which OpenSSL reports to the probe as a ragged EOF)."""
    a = await make_manager("a")
    probe, _hello = await TlsProbe.async_link(tmp_path / "probe", a.listen_port)
    try:
        await wait_until(lambda: a.link(probe.node_id) is not None, what="a to register the probe's link")
        a.link(probe.node_id).close("test")
        assert await asyncio.wait_for(probe.async_how_it_ends(), 10) == "close_notify"
    finally:
        await probe.async_abort()


@pytest.mark.parametrize(("ending", "partial", "cause"), [
    ("close_notify", False, "eof"), ("bare_fin", False, "eof"),
    ("close_notify", True, "truncated frame"), ("bare_fin", True, "truncated frame"),
], ids=["close-notify", "bare-fin", "close-notify-mid-frame", "bare-fin-mid-frame"])
async def test_how_a_peer_ended_its_link(make_manager, fast_net, tmp_path, ending, partial, cause):
    """At a frame boundary a FIN is a clean end with or without close_notify (frames are length
    delimited, so a cut shows as a truncated frame instead, whichever way TLS ends)."""
    a = await make_manager("a")
    probe, _hello = await TlsProbe.async_link(tmp_path / "probe", a.listen_port)
    try:
        await wait_until(lambda: a.link(probe.node_id) is not None, what="a to register the probe's link")
        link = a.link(probe.node_id)
        if partial:
            await probe.async_send_raw(frame_bytes(Frame(FrameType.WORK, {"n": 1}, b"x" * 100))[:-10])
        await (probe.async_close_notify() if ending == "close_notify" else probe.async_bare_fin())
        assert await asyncio.wait_for(link.closed, 10) and link.close_cause == cause
    finally:
        await probe.async_abort()


async def test_a_node_closing_a_link_is_a_clean_end_for_the_node_at_the_other_end(make_manager, fast_net, caplog):
    caplog.set_level(logging.INFO)
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    b_link = a.link(b.node_id)
    b.link(a.node_id).close("test")
    await b_link.closed
    assert b_link.close_cause == "eof"
    assert f"DIAG: connection closed peer_id={b.short_id} connection_id={b_link.connection_id} cause=eof" \
        in caplog.text


async def test_several_frames_in_one_write_arrive_whole_and_in_order(make_manager, fast_net):
    """send_many_nowait (the pipeline's ACK + RESULT): one TLS write, each frame delivered intact."""
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    seen: list[tuple[int, dict, bytes]] = []
    a.register_handler(FrameType.ACK, lambda link, frame: seen.append((frame.type, frame.header, frame.payload)))
    a.register_handler(FrameType.RESULT, lambda link, frame: seen.append((frame.type, frame.header, frame.payload)))
    link = b.link(a.node_id)
    before = link.frames_out
    big = bytes(range(256)) * 4096  # 1 MiB: more than one TLS record
    link.send_many_nowait([Frame(FrameType.ACK, {"i": 0}), Frame(FrameType.RESULT, {"i": 1}, big),
                           Frame(FrameType.ACK, {"i": 2})])
    await wait_until(lambda: len(seen) == 3)
    assert [(t, h["i"]) for t, h, _ in seen] == [(FrameType.ACK, 0), (FrameType.RESULT, 1), (FrameType.ACK, 2)]
    assert seen[1][2] == big and seen[0][2] == b"" and link.frames_out == before + 3


async def test_frame_lines_need_vv_and_pings_vvv(make_manager, fast_net, caplog):
    """-v shows one line per event (the link established), not one per frame; -vv adds the frames;
    -vvv the pings too (seed 000: `-vv | grep codec`, `-vvv` full trace)."""
    from node.logs import level_for_verbosity

    levels = [level_for_verbosity(v) for v in range(4)]
    assert levels == sorted(levels, reverse=True) and len(set(levels)) == 4
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b))
    a.register_handler(FrameType.WORK, echo)
    seen = {}
    for verbosity in (1, 2, 3):
        caplog.clear()
        caplog.set_level(level_for_verbosity(verbosity))
        await b.async_request(a.node_id, Frame(FrameType.WORK, {"n": verbosity}), timeout_s=10)
        if verbosity == 3:  # a ping round on the TRACE level
            await wait_until(lambda: "type=PING" in caplog.text, what="a PING line at -vvv")
        seen[verbosity] = caplog.text
    assert "DIAG: sent frame" not in seen[1] and "DIAG: received frame" not in seen[1]
    assert "DIAG: sent frame" in seen[2] and "type=WORK" in seen[2] and "type=PING" not in seen[2]
    assert "type=PING" in seen[3]


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
