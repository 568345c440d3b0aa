"""Failures this node's own pause cannot explain are charged to the peer, even right after a pause
(review r25, finding 2; before, `_own_pause` excused any silence or next_hop_unreachable that came
within SELF_PAUSE_GRACE_S of a pause the attempt lived through: the peer was neither left out nor
recorded silent, and the next attempt was planned on it again):

- a step sent AFTER the pause to a peer that never answers: its deadline is the peer's (deadlines.py
  already charged it: no pause fell in its wait);
- a next hop that a PEER could not reach (B cannot reach C, neither of them this node);
- a later hop whose deadline started only after the pause (the ACK before it read as it ended).

And the one it can: this node's own segment not reaching the next peer after the pause is excused.

Driven on the real PipelineCoordinator, PipelineRun, StepDeadlines and LoopWatchdog, with the
stand-in peer table of tests/support/pause_harness.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from types import SimpleNamespace

import pytest

from node import const
from node.inference.pipeline.coordinator import PipelineCoordinator
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import Ack, Result, Work
from node.net import FrameType
from tests.support.pause_harness import (
    HELD_AFTER,
    MAX_NEW,
    ME,
    PEER,
    SHA,
    Link,
    Peers,
    coordinating,
    next_hop_unreachable,
    pause_with_a_result_held,
    streaming,
    watched_loop,
)
from tests.support.waiting import wait_until

NEXT = "c" * 64  # the second segment's holder


class Mute:
    """A link to a peer that takes every frame and never answers (stalled, or its end gone)."""

    last_seen = time.monotonic()

    def send_nowait(self, frame) -> None:
        pass


class TwoHops(Peers):
    """The stand-in peer table with the model split over two peers: PEER [0-4), then NEXT [4-8).
    PEER's stand-in link answers each WORK with the chain's RESULT (the coordinator sends only to hop 0)."""

    def __init__(self):
        super().__init__()
        first = {**self.snap.models[0], "end": 4}
        self.snap = dataclasses.replace(self.snap, models=(first,))
        self.next = dataclasses.replace(self.snap, node_id=NEXT, short_id=NEXT[:8], connection_id=9,
                                        models=({**first, "start": 4, "end": 8},))
        self.next_link = Link(self)

    def peers(self):
        return [*super().peers(), self.next]

    def peer(self, node_id):
        return self.next if node_id == NEXT else super().peer(node_id)

    def link(self, node_id):
        return self.next_link if node_id == NEXT else super().link(node_id)


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_step_sent_after_this_nodes_pause_to_a_silent_peer_is_charged_to_the_peer(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(const, "ROUTE_REGAIN_S", 1.0)
    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        _run, trace, consuming, _got = await streaming(coordinator, "req-a")
        try:
            held = await pause_with_a_result_held(peers)  # the attempt lives through the pause ...
            await wait_until(lambda: dog.pauses, 5, 0.01, "the watchdog to record the pause")
            peers.live = Mute()  # ... then the peer falls silent: the next step, sent after the pause, goes unanswered
            peers.deliver(held)
            await wait_until(lambda: trace.failure_causes, 10, 0.01, "the silent step's attempt to fail")
            assert trace.failure_causes[0] == "ack_deadline", trace.failure_causes
            assert "pipeline attempt failed because this node was paused" not in caplog.text
            assert "DIAG: pipeline attempt failed request_id" in caplog.text  # charged: left out, recorded silent
            await asyncio.wait_for(asyncio.gather(consuming, return_exceptions=True), 30)
        finally:
            consuming.cancel()


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_next_hop_one_peer_cannot_reach_right_after_this_nodes_pause_is_charged(caplog):
    caplog.set_level(logging.INFO)
    peers = TwoHops()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        run, trace, consuming, got = await streaming(coordinator, "req-b")
        assert [h.node_id for h in run.attempt.route] == [PEER, NEXT] and run.attempt.kinds == ["direct", "direct"]
        held = await pause_with_a_result_held(peers)
        # PEER reports it cannot reach NEXT: a matter between them, not this node's pause
        peers.deliver(next_hop_unreachable(held, NEXT))
        await asyncio.wait_for(consuming, 30)  # NEXT tried again after NEXT_HOP_RETRY_S: it is reachable now
        assert len(got) == MAX_NEW
        assert trace.failure_causes == ["next_hop_unreachable"], trace.failure_causes
        assert "pipeline attempt failed because this node was paused" not in caplog.text
        assert "DIAG: pipeline attempt failed request_id" in caplog.text


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_a_later_hop_silent_after_its_clock_started_past_this_nodes_pause_is_charged(monkeypatch, caplog):
    """Route PEER -> NEXT; the step goes out, this node pauses, PEER's ACK is read when the pause
    ends, so NEXT's ACK deadline starts after the pause; NEXT never answers. Its silence is NEXT's
    (review r28, finding 1: `SegmentFailed.since` was the step's send time, before the pause, so
    `_own_pause` excused it: NEXT was neither left out nor recorded silent, and planned on again)."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(const, "ROUTE_REGAIN_S", 1.0)
    peers = TwoHops()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        run, trace, consuming, _got = await streaming(coordinator, "req-c")
        try:
            assert [h.node_id for h in run.attempt.route] == [PEER, NEXT] and run.attempt.kinds == ["direct", "direct"]
            held = await pause_with_a_result_held(peers)  # the step was sent before the pause
            # PEER's ACK (its output on its way to NEXT), read as the pause ends
            coordinator.on_ack(Ack(held["sid"], held["seq"], 0, PEER, done=True).to_header(), b"", PEER)
            await wait_until(lambda: trace.failure_causes, 10, 0.01, "NEXT's silent ACK to fail the attempt")
            assert trace.failure_causes[0] == "ack_deadline", trace.failure_causes
            assert "pipeline attempt failed because this node was paused" not in caplog.text
            assert f"node={NEXT[:8]} cause=ack_deadline" in caplog.text  # charged: left out, recorded silent
            await asyncio.wait_for(asyncio.gather(consuming, return_exceptions=True), 30)
        finally:
            consuming.cancel()


class LocalWorker:
    """This node's own first segment [0-4) (the stand-in of its worker): answers each WORK with the
    chain's RESULT on a later loop pass, holding the one after HELD_AFTER until the test lets it go."""

    def __init__(self, transport: PipelineTransport):
        self.coordinator: PipelineCoordinator | None = None
        self.works, self.held = 0, None
        transport.on_local(FrameType.WORK, self.on_work)
        for ftype in (FrameType.SESSION_END, FrameType.CANCEL):
            transport.on_local(ftype, lambda header, payload, sender: None)

    def for_model(self, sha256):
        return [SimpleNamespace(start=0, end=4, ms_per_layer=1.0, checking=False, entry=SimpleNamespace(changed=False))] if sha256 == SHA else []

    def adverts(self):
        return []

    def on_work(self, header: dict, payload: bytes, sender: str) -> None:
        work = Work.from_header(header)
        self.works += 1
        result = Result(work.sid, work.seq, token=100 + work.index_pos).to_header()
        if self.works == HELD_AFTER + 1:
            self.held = result
        else:
            asyncio.get_running_loop().call_soon(self.coordinator.on_result, result, b"", ME)


@pytest.mark.blocks_loop("this node's own pause mid-stream")
async def test_this_nodes_own_segment_not_reaching_the_next_peer_after_its_pause_is_excused(caplog):
    """Route ME (local) -> PEER: this node's own segment cannot forward to PEER, which dropped the
    link while this node was paused. That is this node's pause, not PEER's fault: PEER is not left
    out and the attempt does not count (review r28, finding 3: only the first-hop case was tested)."""
    caplog.set_level(logging.INFO)
    peers = Peers()
    peers.snap = dataclasses.replace(peers.snap, models=({**peers.snap.models[0], "start": 4},))
    transport = PipelineTransport(ME, peers)
    worker = LocalWorker(transport)
    with watched_loop() as dog, coordinating(peers, pauses=dog, host=worker, transport=transport) as coordinator:
        worker.coordinator = coordinator
        run, trace, consuming, got = await streaming(coordinator, "req-d")
        assert [h.node_id for h in run.attempt.route] == [ME, PEER] and run.attempt.kinds == ["local", "direct"]
        held = await pause_with_a_result_held(worker, "this node's segment to hold a RESULT")
        # after the pause, its forward to PEER finds no link
        coordinator.on_result(next_hop_unreachable(held), b"", ME)
        await asyncio.wait_for(consuming, 30)
        assert len(got) == MAX_NEW
        assert trace.failure_causes == ["self_paused"], trace.failure_causes
        assert caplog.text.count("pipeline attempt failed because this node was paused") == 1
        assert "DIAG: pipeline attempt failed request_id" not in caplog.text
        assert [h.node_id for h in run.attempt.route] == [ME, PEER]  # planned on PEER again
