"""A step's ACK deadline that ran out while this node itself did not run (its loop stalled past
SELF_PAUSE_MIN_S: SIGSTOP, a lid closed, a VM paused) is pushed back by the pause (the budget left
when it began, not a fresh one), SELF_PAUSE_REARMS times per step at most, not charged to the peer:
the peer's late answer is still taken. (A real coordinator paused mid-stream:
test_coordinator_paused.py; there the peer's frames of that time are read before the timers fire,
so this case — a WORK not yet on the wire when the node stopped, a prefill behind a full buffer —
is driven here on the real deadline machinery and the real loop watchdog.)"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from node import const
from node.errors import SegmentFailed
from node.inference.pipeline.deadlines import Attempt, Step, StepDeadlines
from node.inference.pipeline.perf import PeerPerformance
from node.inference.pipeline.planner import Plan
from node.inference.pipeline.wire import Hop, Result
from node.trace import RequestTrace
from tests.support.pause_harness import pause_this_node, watched_loop
from tests.support.waiting import wait_until


async def _waiting_step(dog, sid: str):
    """A step sent to `peer-node` whose ACK deadline is armed: (the step, the task waiting for it,
    the peer's ACK budget)."""
    deadlines = StepDeadlines("self-node", None, PeerPerformance("self-node"), dog)
    loop = asyncio.get_running_loop()
    att = Attempt(sid=sid, model_sha="m", plan=Plan([]), route=(Hop("peer-node", 0, 2),), kinds=["direct"],
                  failed=loop.create_future())
    step = att.steps[0] = Step(seq=0, n_tokens=1, sent_at=time.monotonic(), result=loop.create_future())
    waiting = asyncio.create_task(deadlines.wait(att, step, RequestTrace(model="m", operation="chat.completions")))
    await wait_until(lambda: step.timer is not None, 5, what="the ACK deadline armed")
    return step, waiting, deadlines.ack_budget("peer-node")


@pytest.mark.blocks_loop("this node's own pause while a step waits for its peer")
async def test_a_deadline_run_out_while_this_node_was_paused_is_re_armed(caplog):
    caplog.set_level(logging.INFO)
    with watched_loop() as dog:
        step, waiting, budget = await _waiting_step(dog, "r/1")
        pause_this_node(budget + const.SELF_PAUSE_MIN_S)
        resumed = time.monotonic()
        # the overdue timer fires in the next loop pass: it fails the step (charged to the peer) or re-arms
        await wait_until(lambda: step.result.done() or getattr(step, "armed", (0.0,))[0] >= resumed, 5,
                         what="the deadline that ran out during the pause to fire")
        assert not step.result.done(), step.result.result()
        step.result.set_result(Result(sid="r/1", seq=0, token=7))  # the peer's answer, after the pause
        outcome = await waiting
        assert not isinstance(outcome, SegmentFailed) and outcome.token == 7
        assert "pipeline deadline ran out while this node was paused: re-armed" in caplog.text
        assert "not acknowledged within the ACK deadline" not in caplog.text
        await wait_until(lambda: dog.pauses, 5, what="the watchdog to record the pause")
        assert caplog.text.count("DIAG: this node was paused") == 1


@pytest.mark.blocks_loop("this node's own pauses while a step waits for its peer")
async def test_a_pause_pushes_a_deadline_back_by_the_pause_not_a_fresh_budget_and_only_so_often(caplog):
    """Review r21 finding 4: any overlap with a pause re-armed the deadline with a whole fresh
    budget from now, any number of times (a silent peer kept for ever by a node that stalls now and
    then). Now the deadline moves back by the pause, at most SELF_PAUSE_REARMS times per step."""
    caplog.set_level(logging.INFO)
    with watched_loop() as dog:
        step, waiting, budget = await _waiting_step(dog, "r/2")
        for n in range(const.SELF_PAUSE_REARMS):
            armed_at, span = step.armed
            # most of the budget passes with the node running, then it pauses past the deadline
            late = armed_at + 0.7 * span
            await wait_until(lambda late=late: time.monotonic() >= late, 5, 0.01, what="most of the budget")
            pause_this_node(max(0.0, armed_at + span - time.monotonic()) + const.SELF_PAUSE_MIN_S + 0.2)  # paused
            resumed = time.monotonic()
            await wait_until(lambda resumed=resumed: step.result.done() or step.armed[0] >= resumed, 5, 0.01,
                             what="the deadline that ran out during the pause to fire")
            assert not step.result.done(), (n, step.result.result())
            # pushed back by the pause: what was left of the budget when it began, not a fresh one
            assert step.armed[1] < span / 2, (n, step.armed, budget)
        pause_this_node(max(0.0, step.armed[0] + step.armed[1] - time.monotonic()) + const.SELF_PAUSE_MIN_S + 0.2)
        with pytest.raises(SegmentFailed) as failed:  # paused once more: now charged to the peer
            await asyncio.wait_for(waiting, 10)
        assert failed.value.cause == "ack_deadline"
        assert caplog.text.count("re-armed") == const.SELF_PAUSE_REARMS
