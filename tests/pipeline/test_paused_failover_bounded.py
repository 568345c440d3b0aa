"""A coordinator back from a pause whose peer still looks connected while every send to it fails
at once (the window between a link starting to close and the peer table saying so) must not spin:
the excused failover ("this node was paused, not the peer") is granted once per pause and node,
the next failure counts toward MAX_ASSEMBLIES, and the request waits for the peer on the loop
(other tasks run) and goes on once it relinks. Before (review r21, finding 1), every attempt was
excused again, no await in open → send → fail → excuse ever suspended, the loop never ran: 100%
CPU, a stream that never ended, the API and pings dead.

Driven on the real PipelineCoordinator, PipelineRun, StepDeadlines, PipelineTransport and
LoopWatchdog with the stand-in peer table of tests/support/pause_harness.py, whose peer answers WORK
with RESULT and can show the close window (the table says connected, link() is None)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading

import pytest

from node import const
from node.errors import InsufficientCapacity
from node.inference.pipeline.wire import Result, Work
from tests.support.pause_harness import (
    MAX_NEW,
    PEER,
    Link,
    Peers,
    begin,
    coordinating,
    next_hop_unreachable,
    pause_this_node,
    pause_with_a_result_held,
    request,
    streaming,
    watched_loop,
)
from tests.support.waiting import wait_until


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_failover_excused_by_a_pause_that_fails_again_at_once_still_ends(caplog):
    caplog.set_level(logging.INFO)
    peers = Peers()
    valve = threading.Timer(20.0, lambda: setattr(peers, "broken", True))
    valve.start()
    ticks = [0]

    async def ticker():
        while True:
            await asyncio.sleep(0.01)
            ticks[0] += 1

    ticking = asyncio.create_task(ticker())
    try:
        with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
            _run, trace, consuming, got = await streaming(coordinator, "req-1")
            # the node pauses; meanwhile its peer answered and, hearing nothing, began closing the link:
            # the table still says connected, but there is no link to send on
            held = await pause_with_a_result_held(peers)
            peers.live = None
            peers.deliver(held)
            before = ticks[0]
            await wait_until(lambda: ticks[0] >= before + 5, 10, 0.01, "the loop to run other tasks after the pause")
            assert not peers.broken, "the request kept the loop busy until the test gave up"
            assert not consuming.done() or consuming.exception() is None, consuming.exception()
            # the table catches up: the link closed, then the peer links again on a new connection
            # (the table says so without an event: the request finds it when it looks)
            peers.relink("disconnected")
            peers.connection, peers.live = 2, Link(peers)
            peers.snap = dataclasses.replace(peers.snap, state="connected")
            await asyncio.wait_for(consuming, 30)
            assert len(got) == MAX_NEW  # failed over, nothing lost
            assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
            assert trace.assemblies <= 1 + const.MAX_ASSEMBLIES
    finally:
        valve.cancel()
        valve.join()
        ticking.cancel()


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_next_hop_unreachable_right_after_this_nodes_pause_is_not_the_peers_fault(caplog):
    """A next_hop_unreachable naming the route's first hop, the one peer here: the hop before it is
    this node, the coordinator, that the peer dropped during the pause; excused like a link drop
    (review r21, finding 3; before: WARN, the peer left out, the attempt counted). This node's own
    segment not reaching the next peer (route [this node (local), peer]):
    test_own_pause_charges.py::test_this_nodes_own_segment_not_reaching_the_next_peer_after_its_pause_is_excused."""
    caplog.set_level(logging.INFO)
    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        _run, _trace, consuming, got = await streaming(coordinator, "req-2")
        held = await pause_with_a_result_held(peers)
        peers.deliver(next_hop_unreachable(held))
        await asyncio.wait_for(consuming, 30)
        assert len(got) == MAX_NEW
        assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
        assert "DIAG: pipeline attempt failed request_id" not in caplog.text
        assert "NO standby available" not in caplog.text


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_the_503_after_waiting_for_a_peer_lost_to_this_nodes_pause_says_how_it_was_lost(monkeypatch, caplog):
    """A peer that dropped this node during its pause and never came back: the request waits for it,
    then fails with a 503 that says how it was lost (review r21, finding 5: an excused failure set
    no last failure, so the message was "waited 15 s for bbbbbbbb to link again" and no why)."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(const, "ROUTE_REGAIN_S", 1.0)
    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        _run, _trace, consuming, _got = await streaming(coordinator, "req-3")
        await pause_with_a_result_held(peers)
        peers.relink("disconnected")  # it heard nothing for its liveness deadline and closed the link
        with pytest.raises(InsufficientCapacity) as failed:
            await asyncio.wait_for(consuming, 30)
        assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
        message = failed.value.message
        assert f"for {PEER[:8]} to link again" in message, message
        assert f"(last: {PEER[:8]} link_drop: " in message, message
        assert message.endswith("(after this node's own pause))"), message


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_peer_excused_once_then_left_out_for_an_error_is_not_taken_back_when_it_relinks(caplog):
    """A peer whose failure was excused by this node's pause (kept in the request's `lost`, same
    link), then failing the request with an error and going away, is not waited for nor taken back
    when it links again: a node left out for how it failed stays out (review r21, finding 5: the
    excused failure's entry stayed, so the request waited for it and went on through it)."""
    caplog.set_level(logging.INFO)
    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        _run, _trace, consuming, _got = await streaming(coordinator, "req-4")
        held = await pause_with_a_result_held(peers)
        errs: list[dict] = []

        def crash(work: Work) -> dict:  # the next WORK: an error, then its node is gone
            peers.answer = None
            errs.append(Result(work.sid, work.seq, error="CUDA error: out of memory", error_code="error",
                               failed_node=PEER).to_header())
            loop = asyncio.get_running_loop()  # the link closes after the error came (a pass later)
            loop.call_soon(loop.call_soon, peers.relink, "disconnected")
            return errs[-1]

        peers.answer = crash
        peers.deliver(next_hop_unreachable(held))  # excused: its link is still the one it was
        await wait_until(lambda: consuming.done() or "waiting for a lost peer" in caplog.text, 10, 0.01,
                         "the request to fail or to wait")
        peers.relink("connected", connection=2)  # it comes back (restarted) within ROUTE_REGAIN_S
        with pytest.raises(InsufficientCapacity) as failed:
            await asyncio.wait_for(consuming, 30)
        assert errs, "the peer was not asked again after the excused failure"
        assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
        assert "waiting for a lost peer" not in caplog.text
        message = failed.value.message
        assert "left out after failing this request" in message and "CUDA error" in message, message


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_failed_n_times_counts_only_the_attempts_charged(caplog):
    """The request that ends after MAX_ASSEMBLIES failures says it failed MAX_ASSEMBLIES times, and
    how many more were excused by this node's pause (review r21, finding 5: it counted the excused
    attempt too, "failed 4 times" for 3)."""
    caplog.set_level(logging.INFO)
    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        _run, _trace, consuming, _got = await streaming(coordinator, "req-5")
        held = await pause_with_a_result_held(peers)
        # the peer's own next hop stays unreachable: tried again after NEXT_HOP_RETRY_S each time
        peers.answer = lambda work: next_hop_unreachable({"sid": work.sid, "seq": work.seq})
        peers.deliver(next_hop_unreachable(held))
        with pytest.raises(InsufficientCapacity) as failed:
            await asyncio.wait_for(consuming, 30)
        assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
        assert caplog.text.count("DIAG: pipeline attempt failed request_id") == const.MAX_ASSEMBLIES
        message = failed.value.message
        assert f"failed {const.MAX_ASSEMBLIES} times (and 1 more after this node's own pause)" in message, message


STANDBY = "c" * 64


class WithStandby(Peers):
    """The stand-in peer table with a second, slower holder of the whole model: the plan's standby."""

    def __init__(self):
        super().__init__()
        models = ({**self.snap.models[0], "ms_per_layer": 3.0},)
        self.standby = dataclasses.replace(self.snap, node_id=STANDBY, short_id=STANDBY[:8], models=models,
                                           connection_id=7)
        self.standby_link = Link(self)

    def peers(self):
        return [*super().peers(), self.standby]

    def peer(self, node_id):
        return self.standby if node_id == STANDBY else super().peer(node_id)

    def link(self, node_id):
        return self.standby_link if node_id == STANDBY else super().link(node_id)


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_peer_gone_while_the_table_still_says_connected_fails_over_to_the_standby_at_once(paused, caplog):
    """A lost peer with no link while the table still says connected is waited for like a dropped
    one (holders.regain, 2026-12-07) only when no route is left: with a standby the request goes
    on there without waiting, the table never catching up (a guard: this was so before too)."""
    caplog.set_level(logging.INFO)
    peers = WithStandby()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        run, trace, consuming, got = await streaming(coordinator, "req-6")
        assert [h.node_id for h in run.attempt.plan.segments] == [PEER]
        await wait_until(lambda: peers.held is not None, 10, 0.01, "the peer to hold a RESULT")
        if paused:
            pause_this_node(const.SELF_PAUSE_MIN_S + 0.3)
        peers.live = None  # its link is gone for good; its table entry stays "connected"
        peers.deliver(peers.held)
        await asyncio.wait_for(consuming, 30)
        assert len(got) == MAX_NEW
        assert caplog.text.count("pipeline attempt failed because this node was paused") == int(paused)
        # excused, the peer is not left out, but with no link it is planned on no more (2026-12-07:
        # it was, that send failed at once and was charged, then the standby): straight to the standby
        assert ("failing over to standby" in caplog.text) is not paused
        assert ("DIAG: pipeline attempt failed request_id" in caplog.text) is not paused
        assert [h.node_id for h in run.attempt.plan.segments] == [STANDBY]
        assert "waiting for a lost peer" not in caplog.text
        assert trace.regain_waits == []


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_the_peer_of_an_excused_failure_with_no_link_is_waited_for_not_planned_on(caplog):
    """After a failure excused by this node's own pause the peer stays in the request; while its
    link is closing (the table still says connected, link() None) the next attempt is not planned
    on it: a send there fails at once and was one of the MAX_ASSEMBLIES attempts burnt, charged to
    the peer (WARN `pipeline attempt failed … cause=unreachable`). It is waited for instead, and the
    request goes on when it links again."""
    caplog.set_level(logging.INFO)
    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        _run, trace, consuming, got = await streaming(coordinator, "req-7")
        held = await pause_with_a_result_held(peers)
        peers.live = None  # it heard nothing for its liveness deadline: its link is closing
        peers.deliver(next_hop_unreachable(held))  # excused: this node's own pause
        await wait_until(lambda: consuming.done() or "waiting for a lost peer" in caplog.text, 10, 0.01,
                         "the request to fail or to wait")
        peers.relink("disconnected")  # the table catches up, then the peer links again
        peers.relink("connected", connection=2)
        await asyncio.wait_for(consuming, 30)
        assert len(got) == MAX_NEW
        assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
        assert "DIAG: pipeline attempt failed request_id" not in caplog.text, "an attempt burnt on a peer with no link"
        assert trace.failure_causes == ["self_paused"]
        assert trace.regain_waits and trace.regain_waits[-1][1] == "regained"


async def test_a_request_arriving_while_its_holders_link_closes_waits_for_it_without_a_failed_attempt(caplog):
    """A request that arrives while its one holder's link is closing (the table still says
    connected) waits for it instead of planning on it: that attempt failed at once (`unreachable`)
    and counted toward MAX_ASSEMBLIES."""
    caplog.set_level(logging.INFO)
    peers = Peers()
    with coordinating(peers) as coordinator:
        peers.live = None
        job, trace = request("req-8", max_new=3)
        beginning = asyncio.create_task(begin(coordinator, job, trace))
        await wait_until(lambda: beginning.done() or "waiting for a lost peer" in caplog.text, 10, 0.01,
                         "the request to fail or to wait")
        assert not beginning.done() or beginning.exception() is None, beginning.exception()
        peers.relink("disconnected")
        peers.relink("connected", connection=2)
        run = await asyncio.wait_for(beginning, 30)
        got = [t async for batch in run.tokens() for t in batch]
        assert len(got) == 3
        assert "DIAG: pipeline attempt failed" not in caplog.text, "an attempt burnt on a peer with no link"
        assert trace.failure_causes == [] and run.attempt_no == 1
        assert trace.regain_waits and trace.regain_waits[-1][1] == "regained"
