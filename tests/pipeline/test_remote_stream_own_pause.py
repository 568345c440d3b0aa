"""A remote generation's TOKENS deadline (a whole model served by a peer, streamed to us) that ran
out while this node itself did not run (SIGSTOP, a lid closed, a VM paused) is pushed back by the
pause, not charged to the holder: its RTO is not backed off and the stream goes on. A silence after
that, with no pause of ours, is the holder's again, and so is one that outlasts SELF_PAUSE_REARMS
such pauses. (The pipeline's step deadlines
do the same: test_deadline_own_pause.py.) Driven on the real RemoteStream and the real loop
watchdog, the loop blocked past the budget as a paused process's is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import pytest

from node import const
from node.errors import SegmentFailed
from node.inference.pipeline.remote_stream import RemoteStream
from node.inference.pipeline.remote_wire import Tokens
from tests.support.pause_harness import pause_this_node, watched_loop
from tests.support.waiting import wait_until

BUDGET_S = 0.5


@contextlib.contextmanager
def holder_stream(sid: str) -> Iterator[tuple[RemoteStream, list[str]]]:
    """A remote generation from `holder-node` under this node's loop watchdog, closed after: (the
    stream, the holders whose RTO it backed off)."""
    backoffs: list[str] = []
    with watched_loop() as dog:
        stream = RemoteStream(sid, "holder-node", BUDGET_S, lambda: backoffs.append("holder-node"), pauses=dog)
        try:
            yield stream, backoffs
        finally:
            stream.close()


@pytest.mark.blocks_loop("this node's own pause while a remote generation waits for its holder")
async def test_a_tokens_deadline_run_out_while_this_node_was_paused_is_re_armed(caplog):
    caplog.set_level(logging.INFO)
    with holder_stream("r/1") as (stream, backoffs):
        stream.feed(Tokens("r/1", 0, (5,)))
        assert (await stream.next()).tokens == (5,)
        pause_this_node(BUDGET_S + const.SELF_PAUSE_MIN_S)
        # the overdue timer fires in the next loop pass: it fails the stream (the holder blamed) or re-arms
        await wait_until(lambda: stream.failure is not None or "re-armed" in caplog.text, 5,
                         what="the deadline that ran out during the pause to fire")
        assert stream.failure is None, stream.failure
        assert backoffs == []  # the holder's RTO untouched
        stream.feed(Tokens("r/1", 1, (6,)))  # the holder's frame of that time, read after the timer
        assert (await stream.next()).tokens == (6,)
        assert "remote generate deadline ran out while this node was paused: re-armed" in caplog.text
        assert "remote generate TIMED OUT" not in caplog.text
        # then the holder falls silent, and this node runs: that is the holder's silence
        with pytest.raises(SegmentFailed) as failed:
            await asyncio.wait_for(stream.next(), 30)
        assert failed.value.cause == "tokens_deadline"
        assert backoffs == ["holder-node"]
        assert caplog.text.count("re-armed") == 1


def _due(stream: RemoteStream) -> float:
    return stream.last_at + stream.budget_s + stream.pushback.pushed


@pytest.mark.blocks_loop("this node's own pauses while a remote generation waits for its holder")
async def test_a_silent_holder_is_charged_after_so_many_pauses_and_gets_no_fresh_budget(caplog):
    """Review r25 finding 1: each pause of 1 s or more re-armed the deadline with a whole fresh
    budget, any number of times: a coordinator whose loop stalls now and then (CPU-starved, App Nap)
    kept a silent holder's stream open for ever, the client seeing neither tokens nor an error. Now
    the deadline moves back by the pause (what was left of the budget when it began), at most
    SELF_PAUSE_REARMS times per silence; then the holder is charged."""
    caplog.set_level(logging.INFO)
    with holder_stream("r/2") as (stream, backoffs):
        for n in range(const.SELF_PAUSE_REARMS + 1):  # the holder never sends; this node pauses past each deadline
            due = _due(stream)
            late = due - 0.3 * stream.budget_s  # most of the budget passes with the node running
            await wait_until(lambda late=late: time.monotonic() >= late, 5, 0.01, what="most of the budget")
            pause_this_node(max(0.0, due - time.monotonic()) + const.SELF_PAUSE_MIN_S + 0.2)
            before = caplog.text.count("re-armed")
            await wait_until(lambda before=before: stream.failure is not None or caplog.text.count("re-armed") > before,
                             5, 0.01, what="the deadline that ran out during the pause to fire")
            if n < const.SELF_PAUSE_REARMS:
                assert stream.failure is None, (n, stream.failure)
                # pushed back by the pause: what was left of the budget when it began, not a fresh one
                assert _due(stream) - time.monotonic() < stream.budget_s / 2, (n, _due(stream) - time.monotonic())
        assert stream.failure is not None and stream.failure.cause == "tokens_deadline", stream.failure
        assert backoffs == ["holder-node"]
        assert caplog.text.count("re-armed") == const.SELF_PAUSE_REARMS
