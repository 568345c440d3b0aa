"""The receive path cannot be broken by anyone holding on to what it handed out.

A link died under load (issue 12) because `Stream._parse_frames` resized its receive buffer while a
view into it was still alive: `BufferError: Existing exports of data`, the transport's fatal error,
then "truncated frame" and every request on the link lost. The views were pinned by a sampled Python
frame (the loop watchdog reads the loop thread's stack); a profiler, a debugger or a traceback kept
in a log record pins them the same way. These tests feed frames in arbitrary chunk boundaries while
the handler keeps every frame, and while every Python frame the parser runs is kept alive.
"""

from __future__ import annotations

import asyncio
import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from node.net._stream import Stream


class _Transport(asyncio.Transport):
    """Just enough transport for a Stream fed by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.paused = False

    def get_extra_info(self, name, default=None):
        return default

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def write(self, data) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def _frames():
    small = st.binary(max_size=64)
    # large payloads from a seed: hypothesis drawing 100 KB byte by byte is slow and adds nothing
    large = st.builds(lambda seed, n: random.Random(seed).randbytes(n), st.integers(0, 2**32),
                      st.integers(64 * 1024, 300 * 1024))
    return st.lists(
        st.builds(Frame, st.sampled_from([FrameType.WORK, FrameType.ACK, FrameType.RESULT, FrameType.PING]),
                  st.dictionaries(st.sampled_from(["a", "seq", "hop"]), st.integers(0, 10**6), max_size=3),
                  st.one_of(small, small, large)),
        min_size=1, max_size=12)


def _feed(wire: bytes, cuts: list[int], *, keep_python_frames: bool) -> tuple[list[Frame], list[str]]:
    """Feed `wire` to a fresh Stream in frame mode, cut at `cuts`; (frames delivered, end causes)."""
    got: list[Frame] = []
    ended: list[str] = []
    kept: list = []  # every Python frame object the parser ran, kept alive (as a sampler would)

    def profiler(frame, event, arg):
        if event == "call":
            kept.append(frame)

    async def go():
        stream = Stream()
        stream.connection_made(_Transport())
        stream.start_frames(got.append, lambda cause, exc: ended.append(cause))
        bounds = sorted({c for c in cuts if 0 < c < len(wire)})
        pieces = [wire[a:b] for a, b in zip([0, *bounds], [*bounds, len(wire)], strict=True)]
        for piece in pieces:
            if keep_python_frames:
                sys.setprofile(profiler)
            try:
                stream.data_received(piece)
            finally:
                sys.setprofile(None)
        stream.connection_lost(None)

    asyncio.run(go())
    kept.clear()
    return got, ended


@given(frames=_frames(), cuts=st.lists(st.integers(0, 4_000_000), max_size=30))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_frames_in_any_chunking_arrive_whole_and_in_order(frames, cuts):
    wire = b"".join(frame_bytes(f) for f in frames)
    got, ended = _feed(wire, [c % (len(wire) + 1) for c in cuts], keep_python_frames=False)
    assert got == frames
    assert ended == ["eof"]


@pytest.mark.blocks_loop("feeds up to megabytes in one step under a profiler hook (0.3 s measured)")
@given(frames=_frames(), cuts=st.lists(st.integers(0, 4_000_000), max_size=30))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_kept_python_frame_or_view_cannot_kill_the_link(frames, cuts):
    """What the watchdog did under load: hold the parser's Python frames (and so its locals)."""
    wire = b"".join(frame_bytes(f) for f in frames)
    got, ended = _feed(wire, [c % (len(wire) + 1) for c in cuts], keep_python_frames=True)
    assert got == frames
    assert ended == ["eof"]


def test_handler_that_keeps_views_of_payloads_does_not_break_the_next_frame():
    """A handler may keep frames and memoryviews of their payloads for as long as it likes."""
    frames = [Frame(FrameType.WORK, {"i": i}, bytes([i]) * (100_000 if i % 2 else 7)) for i in range(6)]
    wire = b"".join(frame_bytes(f) for f in frames)
    views: list[memoryview] = []
    got: list[Frame] = []
    ended: list[str] = []

    def keep(frame: Frame) -> None:
        got.append(frame)
        views.append(memoryview(frame.payload))

    async def go():
        stream = Stream()
        stream.connection_made(_Transport())
        stream.start_frames(keep, lambda cause, exc: ended.append(cause))
        for i in range(0, len(wire), 4093):
            stream.data_received(wire[i:i + 4093])
        stream.connection_lost(None)

    asyncio.run(go())
    assert got == frames and ended == ["eof"]
    assert [bytes(v[:1]) for v in views] == [bytes([i]) for i in range(6)]


def test_truncated_stream_still_reports_a_truncated_frame():
    wire = frame_bytes(Frame(FrameType.WORK, {"a": 1}, b"x" * 1000))
    got, ended = _feed(wire[:-10], [500], keep_python_frames=False)
    assert got == [] and ended == ["truncated frame"]


def test_a_burst_of_small_frames_shares_the_loop_and_arrives_whole():
    """A member's back-to-back PINGs (one read holds thousands) were all answered in one callback:
    other links' replies waited up to 1 s (a probe link's PING p95 481 ms under a flood of
    unknown types; 2.4 ms with the budget). Now at most FRAMES_PER_TURN per loop turn, reading
    paused until the rest is parsed; an end that arrives meanwhile comes after those frames."""
    from node.net._stream import FRAMES_PER_TURN

    frames = [Frame(FrameType.PING, {}, b"", i + 1) for i in range(10 * FRAMES_PER_TURN + 5)]
    wire = b"".join(frame_bytes(f) for f in frames)
    got: list[Frame] = []
    ended: list[str] = []

    async def go():
        transport = _Transport()
        stream = Stream()
        stream.connection_made(transport)
        stream.start_frames(got.append, lambda cause, exc: ended.append(cause))
        seen_by_others: list[int] = []
        asyncio.get_running_loop().call_soon(lambda: seen_by_others.append(len(got)))
        stream.data_received(wire)
        assert len(got) == FRAMES_PER_TURN and transport.paused
        stream.data_received(wire[:7])  # a read already under way: kept, parsed in turn
        for _ in range(100):
            if len(got) == len(frames) and not transport.paused:
                break
            await asyncio.sleep(0)
        assert got == frames and not transport.paused
        assert seen_by_others == [FRAMES_PER_TURN]  # the loop's other work ran between turns
        stream.data_received(wire[7:])
        assert transport.paused
        stream.connection_lost(None)
        assert got == frames * 2 and ended == ["eof"]

    asyncio.run(go())


@given(ops=st.lists(st.tuples(st.sampled_from(["append", "peek", "take", "skip"]), st.binary(max_size=40),
                              st.integers(0, 200)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_receive_buffer_behaves_like_a_byte_string(ops):
    from node.net._recvbuf import RecvBuffer

    buf, model = RecvBuffer(), b""
    for op, data, n in ops:
        n = min(n, len(model))
        if op == "append":
            buf.append(data)
            model += data
        elif op == "peek" and n:
            assert buf.peek(n) == model[:n]
        elif op == "take":
            got = buf.take(n)
            assert type(got) is bytes and got == model[:n]
            model = model[n:]
        elif op == "skip":
            buf.skip(n)
            model = model[n:]
        assert len(buf) == len(model) and bool(buf) == bool(model)
    assert buf.take_all() == model


@pytest.mark.blocks_loop("the stall the watchdog must sample")
def test_watchdog_keeps_no_frame_of_the_loop_after_a_stall():
    """The watchdog samples the loop thread's stack during a stall; the frame it read must not
    outlive the sample, or the stalled function's locals (here a marker; under load, views into
    a receive buffer) stay alive after it returned."""
    import time
    import weakref

    from node.watchdog import LoopWatchdog

    class Marker:
        pass

    refs: list[weakref.ref] = []

    def stall():
        marker = Marker()
        refs.append(weakref.ref(marker))
        time.sleep(0.3)  # blocks the loop on purpose: the stall the watchdog is there to see

    async def go():
        dog = LoopWatchdog(threshold_ms=50, interval_s=0.02)
        dog.start()
        try:
            await asyncio.sleep(0.05)
            stall()
            await asyncio.sleep(0.1)  # the late beat logs the stall
            assert dog.stalls >= 1 and dog.max_stall_ms >= 150
            # no gc.collect(): a frame is freed by reference counting, and a collection long
            # enough to be a stall of its own would make the watchdog sample (and drop) again
            assert refs and refs[0]() is None  # while the watchdog still runs
        finally:
            dog.stop()

    asyncio.run(go())
