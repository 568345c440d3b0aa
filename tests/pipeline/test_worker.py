"""The segment worker in-process: position checks, sampling, session control, malformed input.
The stand-ins (recording peers, a worker over a whole 6-layer model) are in workerkit.py; its ACKs
are in test_worker_acks.py."""

from __future__ import annotations

import asyncio

import pytest

from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.hosted import parse_layers
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import Hop, SessionControl, Work, encode_tokens
from node.inference.pipeline.worker import SegmentWorker
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from node.net import FrameType
from tests.pipeline.swarm import split_model
from tests.pipeline.workerkit import (
    COORD,
    ME,
    NEXT,
    RecordingPeers,
    _first_of_two,
    _results,
    _work,
    first_slice,
    gate_wait,
)
from tests.support.waiting import wait_until


async def test_steps_in_order_then_a_gap_is_refused_naming_both_numbers(worker):
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: len(_results(peers)) == 1, 30, what="first RESULT")
    first = _results(peers)[0]
    assert first.error is None and first.token is not None
    acks = [f for f in peers.sent if f.type == FrameType.ACK]
    assert len(acks) == 1 and acks[0].header["seq"] == 0
    # decode continues at position 3; asking for position 9 instead is a gap
    w.on_work(_work(entry, 1, 9, [first.token]).to_header(), encode_tokens([first.token]), COORD)
    await wait_until(lambda: len(_results(peers)) == 2, 30, what="error RESULT")
    err = _results(peers)[1]
    assert err.error_code == "kv_position_mismatch"
    assert "index_pos=9" in err.error and "kv_len=3" in err.error
    assert err.failed_node == ME


async def test_a_draft_is_verified_in_one_step_and_a_rejected_tail_is_rewound(worker):
    """Greedy decode token by token gives the reference; a step carrying a draft answers the tokens
    up to the first the model disagrees with, and the next step (rewind) continues from there."""
    w, entry, peers = worker
    prompt = [5, 6, 7]
    w.on_work(_work(entry, 0, 0, prompt).to_header(), encode_tokens(prompt), COORD)
    await wait_until(lambda: len(_results(peers)) == 1, 30, what="first RESULT")
    ref = [_results(peers)[0].token]
    for seq in range(1, 7):  # the reference: one token per step
        w.on_work(_work(entry, seq, len(prompt) + seq - 1, [ref[-1]]).to_header(), encode_tokens([ref[-1]]), COORD)
        await wait_until(lambda n=seq + 1: len(_results(peers)) == n, 30, what="RESULT")
        ref.append(_results(peers)[-1].token)
    w.on_session_end(SessionControl("s1", entry.sha256).to_header(), b"", COORD)
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)

    def work(sid, seq, index_pos, tokens, draft=(), rewind=False):
        return Work(sid=sid, model=entry.sha256, seq=seq, index_pos=index_pos, n_tokens=len(tokens) + len(draft),
                    route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=COORD, sample=True,
                    sampling=SamplingParams(temperature=0.0), draft=tuple(draft), rewind=rewind)

    n0 = len(_results(peers))
    w.on_work(work("s2", 0, 0, prompt).to_header(), encode_tokens(prompt), COORD)
    await wait_until(lambda: len(_results(peers)) == n0 + 1, 30, what="prefill RESULT")
    # draft: two right tokens, then a wrong one, then one more
    wrong = (ref[3] + 1) % 512
    draft = [ref[1], ref[2], wrong, ref[4]]
    w.on_work(work("s2", 1, 3, [ref[0]], draft).to_header(), encode_tokens([ref[0], *draft]), COORD)
    await wait_until(lambda: len(_results(peers)) == n0 + 2, 30, what="verify RESULT")
    verified = _results(peers)[-1]
    assert verified.error is None, verified.error
    assert verified.tokens == (ref[1], ref[2], ref[3]) and verified.token == ref[1]
    assert hosted.model.session("s2").kv_len == 3 + 1 + len(draft)  # the rejected rows are still there
    # the next step starts after the two accepted drafts and the model's own token, rewinding
    w.on_work(work("s2", 2, 6, [ref[3]], [ref[4], ref[5]], rewind=True).to_header(),
              encode_tokens([ref[3], ref[4], ref[5]]), COORD)
    await wait_until(lambda: len(_results(peers)) == n0 + 3, 30, what="second verify RESULT")
    assert _results(peers)[-1].tokens == (ref[4], ref[5], ref[6])  # whole draft accepted, then the model's token
    assert hosted.model.session("s2").kv_len == 9


async def test_a_draft_for_a_sampled_session_is_refused(worker):
    w, entry, peers = worker
    sampled = Work(sid="s3", model=entry.sha256, seq=0, index_pos=0, n_tokens=3, route=(Hop(ME, 0, entry.n_layers),),
                   hop=0, coordinator=COORD, sample=True, sampling=SamplingParams(temperature=0.8, seed=1),
                   draft=(4, 4))
    w.on_work(sampled.to_header(), encode_tokens([1, 4, 4]), COORD)
    await wait_until(lambda: _results(peers), 30, what="error RESULT")
    assert _results(peers)[0].error_code == "protocol_error"
    assert "speculative" in _results(peers)[0].error


async def test_unknown_model_range_and_malformed_frames(worker):
    w, entry, peers = worker
    bad = Work(sid="s2", model="0" * 64, seq=0, index_pos=0, n_tokens=1, route=(Hop(ME, 0, 2),), hop=0,
               coordinator=COORD, sample=True, sampling=SamplingParams())
    w.on_work(bad.to_header(), encode_tokens([1]), COORD)
    await wait_until(lambda: _results(peers), 10, what="refusal")
    assert _results(peers)[0].error_code == "segment_not_served"
    w.on_work({"sid": "x", "garbage": True}, b"\x00", COORD)  # malformed: dropped, nothing sent, no crash
    w.on_work(_work(entry, 0, 0, [1, 2]).to_header(), encode_tokens([1]), COORD)  # n says 2, carries 1
    await wait_until(lambda: len(_results(peers)) == 2, 10, what="error for the short payload")
    assert _results(peers)[1].error_code == "protocol_error"


async def test_session_end_frees_kv_and_sampler(worker):
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [3, 4]).to_header(), encode_tokens([3, 4]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    assert "s1" in hosted.model.sessions and "s1" in w.samplers
    w.on_session_end(SessionControl("s1", entry.sha256).to_header(), b"", COORD)
    await wait_until(lambda: "s1" not in hosted.model.sessions and "s1" not in w.samplers, 10, what="free")


async def test_sweep_evicts_idle_sessions_by_ttl(worker):
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [3]).to_header(), encode_tokens([3]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    w.host.session_ttl_s = 0.0
    freed = await w.host.async_sweep()
    assert freed == ["s1"]
    w.forget_expired()
    assert "s1" not in w.samplers


async def test_middle_segment_forwards_activations_to_the_next_hop(tmp_path):
    peers = RecordingPeers()
    async with first_slice(tmp_path, PipelineTransport(ME, peers)) as (w, entry):
        work = _first_of_two(entry, [8, 9], activation_bits=16)
        w.on_work(work.to_header(), encode_tokens([8, 9]), COORD)
        await wait_until(lambda: any(f.type == FrameType.WORK for f in peers.sent), 30, what="forward")
        fwd = next(f for f in peers.sent if f.type == FrameType.WORK)
        nxt = Work.from_header(fwd.header)
        assert nxt.hop == 1 and nxt.act["dtype"] == "f16" and nxt.act["shape"] == [2, 64]
        assert len(fwd.payload) == 2 * 64 * 2
        assert nxt.telemetry[0]["node"] == ME and nxt.telemetry[0]["eval_us"] > 0
        assert nxt.sampling == work.sampling  # the last segment will need it


def test_layers_flag_is_inclusive_and_checked():
    assert parse_layers("0-11", 16) == (0, 12)
    assert parse_layers("12-15", 16) == (12, 16)
    for bad in ("3", "5-2", "0-16", "a-b"):
        with pytest.raises(Exception, match="layers"):
            parse_layers(bad, 16)


async def test_cancel_overtaking_a_late_work_does_not_recreate_the_session(worker):
    """CANCEL travels on the coordinator's link; a WORK forwarded by the previous segment can arrive
    after it. The late WORK must be dropped, not start a new session that lives until the TTL."""
    w, entry, peers = worker
    w.on_cancel(SessionControl("s1", entry.sha256, "cancel").to_header(), b"", COORD)
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    # drain the slice's executor: anything submitted before this marker has run
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    assert w.host.session_count() == 0
    assert "s1" not in w.samplers
    assert not _results(peers)  # nothing computed, nothing reported


async def test_session_end_overtaking_a_late_work_does_not_recreate_the_session(worker):
    """A failed-over attempt is ended with SESSION_END while the coordinator's own slice may still be
    computing its step 0; the WORK it sends afterwards must not start a session here (the soak saw
    one held until the TTL)."""
    w, entry, peers = worker
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end").to_header(), b"", COORD)
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    await asyncio.sleep(0)
    assert w.host.session_count() == 0
    assert not _results(peers)


async def test_queued_steps_of_a_cancelled_session_are_not_computed(worker):
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    gate = asyncio.get_running_loop().create_future()
    blocker = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: gate_wait(gate))
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)  # queued behind blocker
    w.on_cancel(SessionControl("s1", entry.sha256, "cancel").to_header(), b"", COORD)
    gate.get_loop().call_soon_threadsafe(gate.set_result, None)
    await blocker
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    await asyncio.sleep(0)
    assert w.host.session_count() == 0
    assert not _results(peers)


async def test_cancel_for_a_model_not_hosted_here_keeps_no_state(worker):
    w, entry, peers = worker
    for i in range(100):
        w.on_cancel(SessionControl(f"x{i}/1", "f" * 64, "cancel").to_header(), b"", COORD)
    assert len(w.ended) == 0


async def test_tombstones_and_samplers_of_evicted_sessions_are_forgotten(worker):
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [3]).to_header(), encode_tokens([3]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    w.on_cancel(SessionControl("s9", entry.sha256, "cancel").to_header(), b"", COORD)
    assert ("s9", COORD) in w.ended
    w.ended[("s9", COORD)] = 0.0  # let the tombstone expire
    w.host.session_ttl_s = 0.0
    await w.host.async_sweep()  # evicts s1 by TTL; the worker forgets its sampler and the tombstone
    w.forget_expired()
    assert "s1" not in w.samplers
    assert ("s9", COORD) not in w.ended


async def test_a_sub_range_is_served_by_the_smallest_containing_slice(tmp_path):
    """Two slices of one model on this node, 0-5 and 2-5: WORK for 3-5 (hidden states in) runs on
    2-5 (the smallest containing), its KV covers 3-5 only, the token equals the whole model's; WORK
    for 0-1 runs on 0-5 and sends 0-1's hidden states on; 1-5 of a slice of 2-5 is not served."""
    import torch

    from node.inference.pipeline.wire import decode_activations, encode_activations
    from node.inference.slice import SliceModel

    entry = ModelCatalog(None).scan([(split_model(tmp_path), "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)
    await host.async_load(entry, 0, 6)
    await host.async_load(entry, 2, 6)
    peers = RecordingPeers()
    w = SegmentWorker(ME, host, PipelineTransport(ME, peers))
    try:
        assert host.containing(entry.sha256, 3, 6).start == 2
        assert host.containing(entry.sha256, 0, 2).start == 0
        assert host.containing(entry.sha256, 2, 6).start == 2  # exact first
        prompt = [5, 6, 7, 8]

        def references():  # (off the loop: two loads and forwards took 0.3 s of its CPU, the loop police)
            ref = SliceModel.load(entry.path, dtype="f32")
            expected = int(ref.forward(ref.new_session("r"), torch.tensor(prompt), 0, last_only=True)[-1].argmax())
            lower = SliceModel.load(entry.path, 0, 3, dtype="f32")
            hidden = lower.forward(lower.new_session("h"), torch.tensor(prompt), 0)
            return expected, hidden, *encode_activations(hidden, 32)

        expected, hidden, meta, data = await asyncio.get_running_loop().run_in_executor(None, references)
        work = Work(sid="sub", model=entry.sha256, seq=0, index_pos=0, n_tokens=len(prompt),
                    route=(Hop(NEXT, 0, 3), Hop(ME, 3, 6)), hop=1, coordinator=COORD, sample=True,
                    sampling=SamplingParams(temperature=0.0), act=meta)
        w.on_work(work.to_header(), data, NEXT)
        await wait_until(lambda: _results(peers), 30, what="RESULT of the sub-range")
        got = _results(peers)[0]
        assert got.error is None and got.token == expected
        assert [(t["start"], t["end"]) for t in got.telemetry] == [(3, 6)]
        sess = host.find(entry.sha256, 2, 6).model.session("sub")
        assert (sess.layer_start, sess.layer_end, sess.n_layers) == (3, 6, 3)
        assert "sub" not in host.find(entry.sha256, 0, 6).model.sessions
        # the head of the chain on the 0-5 slice: hidden states of layers 0-1 go on to NEXT
        head = Work(sid="top", model=entry.sha256, seq=0, index_pos=0, n_tokens=len(prompt),
                    route=(Hop(ME, 0, 2), Hop(NEXT, 2, 6)), hop=0, coordinator=COORD, sample=True,
                    sampling=SamplingParams(), activation_bits=32)
        w.on_work(head.to_header(), encode_tokens(prompt), COORD)
        await wait_until(lambda: any(f.type == FrameType.WORK for f in peers.sent), 30, what="forwarded WORK")
        fwd = next(f for f in peers.sent if f.type == FrameType.WORK)
        def first_two():
            two = SliceModel.load(entry.path, 0, 2, dtype="f32")
            return two.forward(two.new_session("w"), torch.tensor(prompt), 0)

        want = await asyncio.get_running_loop().run_in_executor(None, first_two)
        fwd_work = Work.from_header(fwd.header)
        assert torch.allclose(decode_activations(fwd_work.act, fwd.payload), want, atol=1e-6)
        assert host.find(entry.sha256, 0, 6).model.session("top").n_layers == 2
        # a range no loaded slice contains
        bad = Work(sid="no", model=entry.sha256, seq=0, index_pos=0, n_tokens=1,
                   route=(Hop(NEXT, 0, 1), Hop(ME, 1, 6)), hop=1, coordinator=COORD, sample=True,
                   sampling=SamplingParams(), act=meta)
        host.slices.pop((entry.sha256, 0, 6)).executor.shutdown(wait=False)
        w.on_work(bad.to_header(), data, NEXT)
        await wait_until(lambda: len(_results(peers)) == 2, 10, what="refusal")
        assert _results(peers)[1].error_code == "segment_not_served"
    finally:
        await host.async_close()


def test_batches_hold_as_many_rows_as_the_kernel_computes_each_alone():
    """A batch's rows are computed as each step's would be alone: float slices and int8 on qgemm
    (every row alone, at its kind's precision) take up to BATCH_MAX_ROWS, int8 on fbgemm (a
    matrix's input quantized over all its rows) RESIDUAL_MAX_ROWS."""
    from types import SimpleNamespace

    from node import const
    from node.inference.weights.linear import RESIDUAL_MAX_ROWS

    def rows(fmt, kernel):
        return SegmentWorker._max_rows(SimpleNamespace(model=SimpleNamespace(fmt=fmt, kernel=kernel)))

    assert rows("f32", "torch") == rows("bf16", "torch") == rows("int8", "qgemm") == const.BATCH_MAX_ROWS
    assert rows("int8", "fbgemm") == RESIDUAL_MAX_ROWS == 8


async def test_a_failed_slice_loaded_again_leaves_no_thread_behind(tmp_path, monkeypatch):
    """A slice that failed to load (say its layers could not be fetched) is loaded again later (the
    --layers retry, every few seconds at first): each failed attempt's executor thread stayed, idle,
    for ever once the next attempt replaced its slice."""
    import threading

    from node.inference.slice import SliceModel

    real_load, fails = SliceModel.load, [3]

    def flaky_load(*args, **kwargs):
        if fails[0]:
            fails[0] -= 1
            raise OSError("the disk hiccuped")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(SliceModel, "load", staticmethod(flaky_load))
    entry = ModelCatalog(None).scan([(split_model(tmp_path), "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)

    def slice_threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name.startswith(f"slice-{entry.name[:12]}-0-6"))

    try:
        for _ in range(3):
            assert (await host.async_load(entry, 0, 6)).state == "failed"
        assert (await host.async_load(entry, 0, 6)).state == "loaded"
        await wait_until(lambda: slice_threads() == 1, what="the failed attempts' threads gone")
    finally:
        await host.async_close()


async def test_a_member_naming_itself_the_hop_before_cannot_step_anothers_session(tmp_path, caplog):
    """A middle segment's session takes steps only from the node whose step opened it, for its
    coordinator: a member that learnt the session id and sent a WORK with a route of its own making
    (itself as the hop before) had the step computed into the session and the RESULT sent to the
    coordinator (a review of the peer-port fixes, 2026-12-06)."""
    import torch

    from node.inference.pipeline.wire import encode_activations
    from node.inference.slice import SliceModel

    other = "d" * 64
    entry = ModelCatalog(None).scan([(split_model(tmp_path), "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)
    await host.async_load(entry, 3, 6)
    peers = RecordingPeers()
    w = SegmentWorker(ME, host, PipelineTransport(ME, peers))
    try:
        lower = await asyncio.get_running_loop().run_in_executor(  # (off the loop: the loop police)
            None, lambda: SliceModel.load(entry.path, 0, 3, dtype="f32"))

        def step(sender: str, seq: int, index_pos: int, tokens: list[int]) -> None:
            hidden = lower.forward(lower.new_session(f"h{seq}"), torch.tensor(tokens), 0)
            meta, data = encode_activations(hidden, 32)
            work = Work(sid="sub", model=entry.sha256, seq=seq, index_pos=index_pos, n_tokens=len(tokens),
                        route=(Hop(sender, 0, 3), Hop(ME, 3, 6)), hop=1, coordinator=COORD, sample=True,
                        sampling=SamplingParams(temperature=0.0), act=meta)
            w.on_work(work.to_header(), data, sender)

        step(NEXT, 0, 0, [5, 6, 7, 8])  # the real chain: NEXT holds 0-2 and opened the session
        await wait_until(lambda: _results(peers), 30, what="RESULT of the real step")
        hosted = host.find(entry.sha256, 3, 6)
        step(other, 1, 4, [9])  # the forger: "I am the hop before"
        await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
        await asyncio.sleep(0.05)
        assert hosted.model.sessions.peek("sub").kv_len == 4 and len(_results(peers)) == 1
        assert "WORK into a session another node opened dropped" in caplog.text
        step(NEXT, 1, 4, [9])  # the real next step still goes on
        await wait_until(lambda: len(_results(peers)) == 2, 30, what="RESULT of the real next step")
    finally:
        await host.async_close()
