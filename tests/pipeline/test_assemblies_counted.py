"""A request's `assemblies` (the summary line's `assemblies=`, the app's Route column "×N") counts
the routes chosen, not each planning try that found none: a request waiting for a lost peer plans
again every ROUTE_REGAIN_POLL_S, and each of those counted (RequestTrace.end_assembly, before
2026-12-07), so a request routed once after a 15 s wait said about 75. Driven on the real
PipelineCoordinator and PipelineRun with the stand-in peer table of tests/support/pause_harness.py."""

from __future__ import annotations

import asyncio
import logging

from tests.support.pause_harness import PEER, Peers, begin, coordinating, request
from tests.support.waiting import wait_until


class Counting(Peers):
    """The stand-in peer table, counting how often the route planning asked for the holder's link."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    def link(self, node_id):
        self.asked += node_id == PEER
        return super().link(node_id)


async def test_a_wait_for_a_lost_peer_counts_one_assembly_not_one_per_check(caplog):
    caplog.set_level(logging.INFO)
    peers = Counting()
    with coordinating(peers) as coordinator:
        peers.live = None  # its link is closing: the request waits for it
        job, trace = request("req-c", max_new=3)
        beginning = asyncio.create_task(begin(coordinator, job, trace))
        await wait_until(lambda: beginning.done() or "waiting for a lost peer" in caplog.text, 10, 0.01,
                         "the request to wait for its holder")
        asked = peers.asked
        await wait_until(lambda: beginning.done() or peers.asked >= asked + 3, 10, 0.01,
                         "the wait to plan again a few times")
        peers.relink("disconnected")
        peers.relink("connected", connection=2)
        run = await asyncio.wait_for(beginning, 30)
        assert len([t async for batch in run.tokens() for t in batch]) == 3
        assert trace.assemblies == 1, trace.assemblies
        assert "assemblies=" not in trace.summary_line()
        assert trace.sched_ms is not None and trace.regain_waits[-1][1] == "regained"
