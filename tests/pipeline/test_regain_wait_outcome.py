"""The outcome a wait for a lost peer records when its handler is cancelled (found in review,
2026-12-06): `client_gone` was recorded for any cancellation, also a request the node had ended
(its stop's drain: the request aborted, its handler cancelled; a forced unload). Now a request
whose job the node cancelled records `gave_up`; a client leaving still records `client_gone`.

The coordinator here is a stand-in with no route and one holder lost a moment ago (the wait and its
cut are what is tested; the whole path with real nodes, a killed holder and a client leaving, is
tests/pipeline/test_failover_metrics.py, which a race between the drain's abort and the handler's
cancel cannot be driven from)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from node.errors import InsufficientCapacity
from node.inference.handoff import GenerationJob
from node.inference.pipeline.run import PipelineRun
from node.inference.sampling import SamplingParams
from node.trace import RequestTrace
from tests.support.waiting import wait_until

LOST = "c" * 64


class _NoRoute:
    """A coordinator whose only other holder dropped its link a moment ago: no attempt opens."""

    def __init__(self):
        self.asked = 0

    def regain(self, sha256, lost, silent=None):
        return set(), [LOST]

    def open_attempt(self, job, entry, trace, attempt_no, excluded):
        self.asked += 1
        raise InsufficientCapacity("no route: layers 3-5 held by nobody linked")


async def _cut_wait(*, node_ended_it: bool) -> RequestTrace:
    coordinator = _NoRoute()
    job = GenerationJob("req-1", [1, 2, 3], SamplingParams(), 8)
    trace = RequestTrace(model="split6", operation="chat.completions")
    run = PipelineRun(coordinator, None, None, job, SimpleNamespace(sha256="a" * 64), trace, lambda _t: False)
    task = asyncio.create_task(run.open())
    await wait_until(lambda: coordinator.asked >= 2, 10.0, 0.01, "the wait for the lost peer")
    if node_ended_it:
        job.cancel.set()  # the drain's abort (or a forced unload), then its handler cancelled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return trace


async def test_a_wait_cut_by_the_node_ending_the_request_is_gave_up():
    trace = await _cut_wait(node_ended_it=True)
    assert [how for _s, how in trace.regain_waits] == ["gave_up"], trace.regain_waits


async def test_a_wait_cut_by_the_client_leaving_is_client_gone():
    trace = await _cut_wait(node_ended_it=False)
    assert [how for _s, how in trace.regain_waits] == ["client_gone"], trace.regain_waits
