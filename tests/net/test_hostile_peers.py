"""Peers that hold resources without using them, found by fuzzing the peer port.

Inbound handshake slots (node.net._inbound): one remote host holds at most MAX_HANDSHAKES_PER_HOST
of them, so connections that open and then say nothing cannot lock every other peer out until they
time out (64 idle connections from one host refused a member 12 times in 13); loopback is this
machine and is not limited. A link's PINGs (node.net._link): not answered while a backlog waits to
go to a peer that reads nothing, and a request whose drain fails leaves no unread exception. PEX
(node.net._pex): a peer with nothing to dial is not passed on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node import const
from node.net._inbound import InboundRouter
from node.net._tasks import Tasks


class SilentStream:
    """A connection from `host` that never sends a byte."""

    def __init__(self, host: str):
        self.host = host
        self.aborted = False
        self._never = asyncio.get_running_loop().create_future()

    def extra(self, name: str):
        return (self.host, 40000) if name == "peername" else None

    async def read_some(self, n: int) -> bytes:
        return await self._never

    def abort(self) -> None:
        self.aborted = True
        if not self._never.done():
            self._never.set_result(b"")

    close = abort


async def test_one_host_holds_a_few_handshake_slots_never_all(caplog):
    caplog.set_level(logging.DEBUG, logger="node.net._inbound")
    router = InboundRouter(tls=None, relay=None, tasks=Tasks(), establish=None)
    cap = const.MAX_HANDSHAKES_PER_HOST
    streams = [SilentStream("192.0.2.7") for _ in range(cap + 3)]
    others = [SilentStream("192.0.2.8"), SilentStream("127.0.0.1"), SilentStream("127.0.0.1")]
    tasks = [asyncio.ensure_future(router.async_serve(s)) for s in streams + others]
    await asyncio.sleep(0)  # each runs to its first read (or is refused before it)
    assert [s.aborted for s in streams] == [False] * cap + [True] * 3
    assert not any(s.aborted for s in others)  # another host, and loopback, still get slots
    refused = [r for r in caplog.records if "too_many_handshakes_from_host" in r.getMessage()]
    assert len(refused) == 3 and refused[0].levelno == logging.WARNING and refused[1].levelno == logging.DEBUG
    for s in streams[:cap]:  # their slots come back when they end
        s.abort()
    await asyncio.gather(*tasks[:cap])
    late = SilentStream("192.0.2.7")
    task = asyncio.ensure_future(router.async_serve(late))
    await asyncio.sleep(0)
    assert not late.aborted
    for s in [late, *others]:
        s.abort()
    await asyncio.gather(task, *tasks[cap:])


class BackloggedStream:
    """A link's stream whose kernel buffer holds `unsent` bytes (the peer reads nothing)."""

    def __init__(self, unsent: int):
        self.unsent = unsent
        self.written: list[bytes] = []

    def writelines(self, parts) -> None:
        self.written += parts


def _link(stream, dispatch=lambda _link, _frame: None):
    from node.net._link import PeerLink
    from node.net._messages import Hello
    from node.net._rto import RtoEstimator

    return PeerLink(stream, node_id="b" * 64, hello=Hello(node_id="b" * 64, boot_id="x", agent="t", listen_port=0),
                    link_nonce="n", transport="direct", is_dialer=False, address="192.0.2.7:1",
                    rto=RtoEstimator(), dispatch=dispatch)


async def test_pings_from_a_peer_that_reads_nothing_get_no_pongs_past_a_backlog():
    """A member flooding PINGs without reading grew the node's memory without bound (fuzzing:
    +90 MB in 15 s); past PONG_MAX_BACKLOG_BYTES waiting for it, its PINGs go unanswered."""
    from node.net._frames import Frame, FrameType

    link = _link
    reading, stuck = BackloggedStream(0), BackloggedStream(const.PONG_MAX_BACKLOG_BYTES + 1)
    for stream in (reading, stuck):
        peer = link(stream)
        for i in range(3):
            peer._on_frame(Frame(FrameType.PING, {}, b"", i + 1))
    assert len(reading.written) > 0 and stuck.written == []


async def test_pex_does_not_pass_on_or_record_a_peer_with_nothing_to_dial():
    """A peer that listens nowhere (HELLO listen_port 0, as the fuzzer's) became, through PEX, a
    "connecting" record on every other node, dialled for ever."""
    from node.net._foreign import ForeignPeers
    from node.net._messages import PexEntry, pex_frame
    from node.net._pex import Pex
    from node.net._table import PeerTable

    dialled = []
    table = PeerTable(lambda _node_id: 0)
    pex = Pex("a" * 64, table, Tasks(), ForeignPeers(lambda: None), set(), dialled.append)
    pex.handle(_link(BackloggedStream(0)), pex_frame([PexEntry("c" * 64, (), ()), PexEntry("d" * 64, ("192.0.2.9:4000",), ())]))
    assert table.get("c" * 64) is None and [r.node_id for r in dialled] == ["d" * 64]


class ClosableStream(BackloggedStream):
    def __init__(self):
        super().__init__(0)
        self.closed = self.aborted = self.stopped = False

    def stop_frames(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


async def test_a_peer_flooding_control_frames_loses_its_link_and_work_frames_are_not_counted(caplog, monkeypatch):
    """A member sending PINGs, unknown types, stray replies or HELLOs back to back had every one
    answered (and at -v logged): a probe link's PING waited up to 1 s behind them. Frames that
    are not the pipeline's work are held to CONTROL_FRAMES_BURST, refilled at
    CONTROL_FRAMES_PER_S; past it the link closes (cause "flooding"), with one WARNING."""
    import time

    from node.net._frames import Frame, FrameType

    monkeypatch.setattr(const, "CONTROL_FRAMES_BURST", 50)
    monkeypatch.setattr(const, "CONTROL_FRAMES_PER_S", 10.0)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    dispatched = []
    stream = ClosableStream()
    link = _link(stream, lambda _link, frame: dispatched.append(frame.type))
    for i in range(500):  # the pipeline's frames: their rate is the work's
        link._on_frame(Frame(FrameType.WORK, {}, b"", i + 1))
    kinds = [Frame(FrameType.PING, {}, b"", 1), Frame(200, {}, b"", 0), Frame(FrameType.PONG, {}, b"", 9, 1),
             Frame(FrameType.HELLO, {}, b"", 0)]
    for i in range(50):  # the burst
        link._on_frame(kinds[i % 4])
    for _ in range(20):  # then a steady 10 a second is within the budget
        clock[0] += 0.1
        link._on_frame(kinds[1])
    assert link.close_cause is None and not stream.stopped
    assert dispatched.count(FrameType.WORK) == 500  # and the others all got their answers:
    assert dispatched.count(200) == 13 + 20 and dispatched.count(FrameType.HELLO) == 12
    assert len(stream.written) == 13  # the PINGs' PONGs (a stray reply is dropped)
    caplog.set_level(logging.WARNING, logger="node.net._link")
    link._on_frame(kinds[0])
    link._on_frame(kinds[0])  # past it: closed at once
    assert link.close_cause == "flooding" and stream.stopped and stream.aborted
    flooding = [r for r in caplog.records if "peer flooding" in r.getMessage()]
    assert len(flooding) == 1 and flooding[0].levelno == logging.WARNING


class StuckStream(BackloggedStream):
    """Writing paused until the link breaks (after `breaks_after` s)."""

    writing_paused = True

    def __init__(self, breaks_after: float):
        super().__init__(0)
        self.breaks_after = breaks_after

    async def drain(self) -> None:
        await asyncio.sleep(self.breaks_after)
        raise ConnectionResetError("peer went away")


async def test_a_request_whose_timer_fires_while_its_drain_fails_leaves_no_unread_exception():
    """The request's timer failed its future during a drain that then raised: asyncio logged
    "Future exception was never retrieved" (seen in a fuzzed node's log)."""
    import gc

    from node.errors import PeerUnreachable
    from node.net._frames import Frame, FrameType

    link = _link(StuckStream(0.05))
    unread = []
    gc.collect()  # other tests' abandoned tasks are reported now, not counted as ours (a review caught 11)
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unread.append(context["message"]))
    try:
        with pytest.raises(PeerUnreachable):
            await link.async_request(Frame(FrameType.PING), timeout_s=0.01)
        gc.collect()  # an unread exception is reported when its future is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert unread == []
