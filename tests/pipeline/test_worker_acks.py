"""The segment worker's ACKs in-process: a quick step acks with its output, a slow one after the
hold; a middle segment forwards first; `done` only for hidden states already on their way; the
coordinator's own segment acks locally. Same stand-ins as test_worker.py (workerkit)."""

from __future__ import annotations

import asyncio

import pytest

from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import encode_tokens
from node.net import FrameType
from tests.pipeline.workerkit import (
    COORD,
    ME,
    RecordingPeers,
    _first_of_two,
    _frames,
    _results,
    _work,
    first_slice,
    gate_wait,
)
from tests.support.waiting import wait_until


async def test_a_quick_step_acks_with_its_output_and_before_the_result(worker, monkeypatch):
    """The ACK of a step that finishes within ACK_HOLD_S goes out with the output (no wake-up of
    this loop or the coordinator's while the slice computes), on the same link before the RESULT."""
    import time

    from node import const

    w, entry, peers = worker
    assert const.ACK_HOLD_S >= 0.05
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    forward = hosted.model.forward_many

    def forward_30ms(*args, **kw):  # a decode step's order of magnitude, well inside the hold
        time.sleep(0.03)
        return forward(*args, **kw)

    monkeypatch.setattr(hosted.model, "forward_many", forward_30ms)
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    assert peers.writes == [[FrameType.ACK, FrameType.RESULT]]  # one write: one TLS pass, one syscall
    ack, result = peers.sent[0].header, _results(peers)[0]
    assert result.telemetry[0]["eval_us"] >= 30_000
    assert ack["held_us"] >= 30_000  # held across the compute, not sent at receipt or mid-step
    assert ack["done"] is True  # the coordinator starts the next hop's clock from here


async def test_a_slow_step_acks_after_the_hold_not_at_its_end(worker, monkeypatch):
    from node import const

    w, entry, peers = worker
    monkeypatch.setattr(const, "ACK_HOLD_S", 0.05)
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    forward = hosted.model.forward_many
    gate = asyncio.get_running_loop().create_future()

    def slow_forward(*args, **kw):  # the step cannot finish before the test has seen the ACK
        gate_wait(gate)
        return forward(*args, **kw)

    monkeypatch.setattr(hosted.model, "forward_many", slow_forward)
    w.on_work(_work(entry, 0, 0, [5, 6]).to_header(), encode_tokens([5, 6]), COORD)
    await wait_until(lambda: any(t == FrameType.ACK for t, _ in _frames(peers)), 10, what="ACK after the hold")
    assert not _results(peers)
    held_us = peers.sent[0].header["held_us"]
    assert 50_000 <= held_us < 5_000_000
    assert "done" not in peers.sent[0].header  # still computing: the step keeps its compute allowance
    gate.set_result(None)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    assert [t for t, _ in _frames(peers)] == [FrameType.ACK, FrameType.RESULT]  # one ACK only


async def test_a_middle_segment_forwards_first_then_acks(tmp_path):
    peers = RecordingPeers()
    async with first_slice(tmp_path, PipelineTransport(ME, peers)) as (w, entry):
        w.on_work(_first_of_two(entry, [8]).to_header(), encode_tokens([8]), COORD)
        await wait_until(lambda: len(peers.sent) == 2, 30, what="forward and ACK")
        assert [f.type for f in peers.sent] == [FrameType.WORK, FrameType.ACK]
        assert peers.sent[1].header["hop"] == 0 and peers.sent[1].header["seq"] == 0
        assert peers.sent[1].header["done"] is True


@pytest.mark.parametrize("why", ["large_payload", "link_backlog"])
async def test_a_forward_that_may_take_a_while_to_arrive_is_not_acked_done(tmp_path, monkeypatch, why):
    """`done` starts the next hop's ACK clock at once: only for hidden states already on their way
    (small, nothing queued ahead of them), else the step keeps its compute allowance."""
    from node import const

    peers = RecordingPeers(unsent=10**6 if why == "link_backlog" else 0)
    if why == "large_payload":
        monkeypatch.setattr(const, "ACK_DONE_MAX_BYTES", 64)  # 2 tokens x 64 wide x f16 = 256 bytes
    async with first_slice(tmp_path, PipelineTransport(ME, peers)) as (w, entry):
        w.on_work(_first_of_two(entry, [8, 9]).to_header(), encode_tokens([8, 9]), COORD)
        await wait_until(lambda: len(peers.sent) == 2, 30, what="forward and ACK")
        assert [f.type for f in peers.sent] == [FrameType.WORK, FrameType.ACK]
        assert "done" not in peers.sent[1].header


async def test_own_segment_reports_a_finished_step_to_its_coordinator_locally(tmp_path):
    """The coordinator's own segment sends no ACK message, but tells the coordinator (a local call)
    when its output has left, which starts the next hop's ACK clock."""
    peers = RecordingPeers()
    transport = PipelineTransport(ME, peers)
    local_acks = []
    transport.on_local(FrameType.ACK, lambda header, payload, sender: local_acks.append((header, sender)))
    async with first_slice(tmp_path, transport) as (w, entry):
        w.on_work(_first_of_two(entry, [8], coordinator=ME).to_header(), encode_tokens([8]), ME)
        await wait_until(lambda: local_acks, 30, what="local ACK")
        assert [f.type for f in peers.sent] == [FrameType.WORK]  # nothing on the wire but the hidden states
        header, sender = local_acks[0]
        assert sender == ME and header["done"] is True and header["hop"] == 0
