"""Peer links between real PeerManagers on 127.0.0.1 (one process, real TCP + TLS 1.3): requests,
handlers, identity, how a link ends, frames on the wire and their log lines. Finding peers and
their coming and going: test_links_peers.py; two links to one peer: test_links_duplicate.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.errors import InvalidRequest, PeerError, PeerIdentityMismatch, RequestTimeout
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from tests.support.waiting import wait_until

from .tlsprobe import TlsProbe
from .util import addr, linked


async def echo(link, frame):
    return frame.reply(FrameType.RESULT, {"echo": True}, frame.payload)


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
