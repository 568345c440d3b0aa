"""The segment worker in-process, continued: kept sessions (prefix reuse on chains) and batched
steps (several sessions' queued steps as one forward). Same stand-ins as test_worker.py."""

from __future__ import annotations

import asyncio

import pytest

from node import const
from node.errors import ProtocolError
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.wire import Hop, SessionControl, Work, encode_tokens
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from tests.pipeline.swarm import split_model
from tests.pipeline.workerkit import (
    COORD,
    ME,
    NEXT,
    _results,
    _work,
    gate_wait,
)
from tests.support.waiting import wait_until


async def _kept_turn(worker) -> tuple:
    """Session s1 computes 40 prompt tokens, then is kept for COORD: (its slice, those tokens)."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    turn1 = list(range(20, 60))
    w.on_work(_work(entry, 0, 0, turn1).to_header(), encode_tokens(turn1), COORD)
    await wait_until(lambda: len(_results(peers)) == 1, 30, what="turn 1 RESULT")
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
    return hosted, turn1


def _first_step(entry, sid: str, index_pos: int, tokens: list[int], coordinator: str = COORD,
                resume: str | None = None, copy: bool = False) -> Work:
    """A session's first greedy WORK over the whole model (at index_pos: a resumed or copied prefix)."""
    return Work(sid=sid, model=entry.sha256, seq=0, index_pos=index_pos, n_tokens=len(tokens),
                route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=coordinator, sample=True,
                sampling=SamplingParams(temperature=0.0), resume=resume, resume_copy=copy)


async def test_a_kept_session_resumes_for_its_coordinator_and_gives_the_fresh_prefills_token(worker):
    """SESSION_END with keep holds the session (not counted as in use); a WORK of a new session
    naming it in `resume` starts at the common prefix and samples what a full prefill samples. A
    resume from another coordinator, or of a session that is gone, is a `kv_miss` error RESULT."""
    w, entry, peers = worker
    hosted, turn1 = await _kept_turn(worker)
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    assert w.host.session_count() == 0 and w.host.kept_count() == 1 and "s1" not in w.samplers

    turn2 = [*turn1[:32], 7, 8, 9, 10]

    def step(sid, index_pos, tokens, coordinator=COORD, resume=None):
        return _first_step(entry, sid, index_pos, tokens, coordinator, resume)

    w.on_work(step("other", 32, turn2[32:], coordinator=NEXT, resume="s1").to_header(), encode_tokens(turn2[32:]), NEXT)
    w.on_work(step("lost", 32, turn2[32:], resume="never-kept").to_header(), encode_tokens(turn2[32:]), COORD)
    w.on_work(step("s2", 32, turn2[32:], resume="s1").to_header(), encode_tokens(turn2[32:]), COORD)
    w.on_work(step("fresh", 0, turn2).to_header(), encode_tokens(turn2), COORD)
    await wait_until(lambda: len(_results(peers)) == 5, 30, what="four RESULTs")
    by_sid = {r.sid: r for r in _results(peers)[1:]}
    assert by_sid["other"].error_code == "kv_miss" and "other_coordinator" in by_sid["other"].error
    assert by_sid["lost"].error_code == "kv_miss" and "evicted" in by_sid["lost"].error
    assert by_sid["s2"].error is None and by_sid["s2"].token == by_sid["fresh"].token
    assert hosted.model.session("s2").kv_len == len(turn2)
    assert w.host.kept_count() == 0 and w.host.session_count() == 2  # s1 became s2; and fresh


async def test_a_copy_of_a_kept_sessions_prefix_leaves_it_kept_and_samples_the_fresh_prefills_token(worker):
    """`resume_copy`: a new session starts with a copy of the kept one's first positions (another
    conversation with the same system prompt); the kept one stays kept, whole, and still resumes.
    The header key survives the wire; `resume_copy` without `resume` is malformed."""
    w, entry, peers = worker
    hosted, turn1 = await _kept_turn(worker)
    other = [*turn1[:16], 3, 4, 5]

    def step(sid, index_pos, tokens, resume=None, copy=False):
        work = _first_step(entry, sid, index_pos, tokens, COORD, resume, copy)
        assert Work.from_header(work.to_header()) == work
        return work.to_header()

    w.on_work(step("copy", 16, other[16:], resume="s1", copy=True), encode_tokens(other[16:]), COORD)
    w.on_work(step("fresh", 0, other), encode_tokens(other), COORD)
    await wait_until(lambda: len(_results(peers)) == 3, 30, what="two RESULTs")
    by_sid = {r.sid: r for r in _results(peers)[1:]}
    assert by_sid["copy"].error is None and by_sid["copy"].token == by_sid["fresh"].token
    assert hosted.model.session("copy").kv_len == len(other)
    assert w.host.kept_count() == 1 and hosted.model.sessions.peek("s1").kv_len == len(turn1)
    turn2 = [*turn1, 9]
    w.on_work(step("s2", len(turn1), turn2[len(turn1):], resume="s1"), encode_tokens(turn2[len(turn1):]), COORD)
    w.on_work(step("fresh2", 0, turn2), encode_tokens(turn2), COORD)
    await wait_until(lambda: len(_results(peers)) == 5, 30, what="two more RESULTs")
    by_sid = {r.sid: r for r in _results(peers)[3:]}
    assert by_sid["s2"].error is None and by_sid["s2"].token == by_sid["fresh2"].token
    bad = step("x", 16, other[16:])
    bad["resume_copy"] = True
    with pytest.raises(ProtocolError, match="resume_copy without resume"):
        Work.from_header(bad)


async def test_a_late_work_of_a_kept_session_does_not_write_into_it(worker):
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
    w.on_work(_work(entry, 1, 3, [9]).to_header(), encode_tokens([9]), COORD)  # the ended attempt's
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    assert hosted.model.sessions.counts() == (0, 1)
    assert hosted.model.sessions.peek("s1").kv_len == 3 and len(_results(peers)) == 1


async def test_keeping_past_the_kv_budget_evicts_the_oldest_kept_session_at_once(worker):
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    for i, sid in enumerate(("k1", "k2", "k3")):
        work = Work(sid=sid, model=entry.sha256, seq=0, index_pos=0, n_tokens=3, route=(Hop(ME, 0, entry.n_layers),),
                    hop=0, coordinator=COORD, sample=True, sampling=SamplingParams(temperature=0.0))
        w.on_work(work.to_header(), encode_tokens([5, 6, 7]), COORD)
        await wait_until(lambda n=i + 1: len(_results(peers)) == n, 30, what="RESULT")
        if i == 0:
            w.host.kv_budget_bytes = int(2.5 * hosted.model.session("k1").nbytes)  # room for two
        w.on_session_end(SessionControl(sid, entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
    await wait_until(lambda: w.host.kept_count() == 2, 10, what="the budget to hold (no periodic sweep)")
    assert "k1" not in hosted.model.sessions and w.host.kv_bytes() <= w.host.kv_budget_bytes


@pytest.fixture
def no_periodic_sweep(monkeypatch):
    from node import const

    monkeypatch.setattr(const, "SESSION_SWEEP_INTERVAL_S", 3600.0)


async def test_sessions_opened_past_the_kv_budget_are_refused_at_once(no_periodic_sweep, worker):
    """A flood of new sessions (none kept, none ended): the budget holds as they open, not at
    the next periodic sweep (found by fuzzing: 28x a 1 MB budget for 8 s). Since 2026-12-06 by
    refusing the newcomers (`overloaded`), not by evicting the sessions in use for them."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    for i in range(8):
        work = Work(sid=f"f{i}", model=entry.sha256, seq=0, index_pos=0, n_tokens=3,
                    route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=COORD, sample=True,
                    sampling=SamplingParams(temperature=0.0))
        w.on_work(work.to_header(), encode_tokens([5, 6, 7]), COORD)
        await wait_until(lambda n=i + 1: len(_results(peers)) == n, 30, what="RESULT")
        if i == 0:
            w.host.kv_budget_bytes = int(2.5 * hosted.model.session("f0").nbytes)  # room for two
    assert w.host.kv_bytes() <= w.host.kv_budget_bytes
    sessions = hosted.model.sessions
    assert len(sessions) == 2 and "f0" in sessions and "f1" in sessions  # the sessions in use stay
    assert {r.sid for r in _results(peers) if r.error_code == "overloaded"} == {f"f{i}" for i in range(2, 8)}


async def test_steps_queued_together_run_as_one_batch_with_each_sessions_lone_token(worker):
    """Steps of five sessions queued behind a busy executor run as one forward (telemetry says
    batch=5) and each samples what it samples alone; a session's two prefill chunks run in order
    (in two batches); a step with a position gap fails alone."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)

    def step(sid, index_pos, tokens, sample=True):
        return Work(sid=sid, model=entry.sha256, seq=index_pos, index_pos=index_pos, n_tokens=len(tokens),
                    route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=COORD, sample=sample,
                    sampling=SamplingParams(temperature=0.0))

    prompts = {f"s{i}": [3 + i, 40 + 7 * i, 11, 90 + i] for i in range(4)}
    long_prompt = list(range(100, 108))
    gate = asyncio.get_running_loop().create_future()
    blocker = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: gate_wait(gate))
    w.on_work(step("p", 0, long_prompt[:4], sample=False).to_header(), encode_tokens(long_prompt[:4]), COORD)
    for sid, prompt in prompts.items():
        w.on_work(step(sid, 0, prompt).to_header(), encode_tokens(prompt), COORD)
    w.on_work(step("p", 4, long_prompt[4:]).to_header(), encode_tokens(long_prompt[4:]), COORD)
    w.on_work(step("gap", 5, [1]).to_header(), encode_tokens([1]), COORD)
    gate.get_loop().call_soon_threadsafe(gate.set_result, None)
    await blocker
    # (the last segment answers every step: p's first chunk with no token)
    await wait_until(lambda: len(_results(peers)) == 7, 30, what="seven RESULTs")
    batched = {r.sid: r for r in _results(peers)}  # p: its second chunk's
    assert batched["gap"].error_code == "kv_position_mismatch"
    assert [r.telemetry[0].get("batch") for r in _results(peers) if r.sid != "gap"][:5] == [5] * 5
    assert batched["p"].telemetry[0].get("batch") is None  # its second chunk ran alone, after the first
    assert hosted.model.session("p").kv_len == 8

    for sid, prompt in [*prompts.items(), ("p", long_prompt)]:  # the same prompts, one at a time
        n = len(_results(peers))
        w.on_work(step("alone-" + sid, 0, prompt).to_header(), encode_tokens(prompt), COORD)
        await wait_until(lambda n=n: len(_results(peers)) == n + 1, 30, what="lone RESULT")
        alone = _results(peers)[-1]
        assert alone.error is None and "batch" not in alone.telemetry[0]
        assert alone.token == batched[sid].token, sid


async def test_only_the_sessions_own_coordinator_may_end_or_keep_it(worker):
    """Another peer that learnt a session id (a member of the same chain) could end that session,
    or keep it for itself, with a SESSION_END or CANCEL of its own (a peer-port hunt, 2026-12-06):
    session control from any node but the session's coordinator is dropped."""
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end", keep=True).to_header(), b"", NEXT)
    w.on_cancel(SessionControl("s1", entry.sha256, "cancel").to_header(), b"", NEXT)
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    assert w.host.kept_count() == 0 and w.host.session_count() == 1  # neither ended nor kept for NEXT
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    assert w.host.kept_count() == 1  # its own coordinator keeps it


async def test_a_step_not_from_its_coordinator_or_previous_segment_is_dropped(worker, caplog):
    """A peer naming another node as the coordinator of its WORK had this node compute the step and
    send the output to a node that never asked for it: a step comes from the coordinator (hop 0)
    or from the segment before it, else it is dropped with one line."""
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), NEXT)  # claims COORD
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)
    await asyncio.sleep(0)
    assert w.host.session_count() == 0 and not peers.sent  # nothing computed, nothing sent, no ACK
    assert "WORK from a node that is not the step's sender dropped" in caplog.text
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT of the real coordinator's step")



async def test_a_tombstone_set_by_another_node_does_not_stop_the_coordinators_steps(worker):
    """SESSION_END for a sid that is not here yet leaves a tombstone, so the late WORK of an ended
    attempt is dropped; set by another node (one that learnt a failover's sid) it stopped the real
    coordinator's steps, which then missed their deadlines."""
    w, entry, peers = worker
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end").to_header(), b"", NEXT)
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT of the coordinator's step")


async def test_a_paused_node_refuses_to_resume_for_others(worker):
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, list(range(20, 40))).to_header(), encode_tokens(list(range(20, 40))), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    w.on_session_end(SessionControl("s1", entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
    assert w.host.kept_count() == 1
    w.contributing = lambda: False
    resume = Work(sid="s2", model=entry.sha256, seq=0, index_pos=16, n_tokens=2, route=(Hop(ME, 0, entry.n_layers),),
                  hop=0, coordinator=COORD, sample=True, sampling=SamplingParams(temperature=0.0), resume="s1")
    w.on_work(resume.to_header(), encode_tokens([1, 2]), COORD)
    await wait_until(lambda: len(_results(peers)) == 2, 10, what="refusal")
    assert _results(peers)[1].error_code == "not_contributing"


async def test_a_busy_slice_lets_frees_and_sweeps_run_between_its_batches(worker):
    """The drain runs one batch per executor task: a task submitted while steps queue runs after
    the batch in progress, not after the whole queue; and a bad step fails alone in its batch."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    gate = asyncio.get_running_loop().create_future()
    blocker = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: gate_wait(gate))
    n = 20
    for i in range(n):
        tokens = [9999] if i == 3 else [3 + i, 4]  # one id outside the vocabulary
        work = Work(sid=f"b{i}", model=entry.sha256, seq=0, index_pos=0, n_tokens=len(tokens),
                    route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=COORD, sample=True,
                    sampling=SamplingParams(temperature=0.0))
        w.on_work(work.to_header(), encode_tokens(tokens), COORD)
    seen = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: hosted.model.sessions.counts()[0])
    gate.get_loop().call_soon_threadsafe(gate.set_result, None)
    await blocker
    from node import const
    assert await seen == const.BATCH_MAX_STEPS - 1  # the first batch (less the bad step) ran, the rest had not
    await wait_until(lambda: len(_results(peers)) == n, 30, what="every RESULT")
    by_sid = {r.sid: r for r in _results(peers)}
    assert by_sid["b3"].error_code == "engine_error" and "token id out of range" in by_sid["b3"].error
    assert [sid for sid, r in by_sid.items() if r.error is not None] == ["b3"]


async def test_the_node_wide_budget_evicts_one_slices_kept_sessions_before_anothers_in_use(tmp_path):
    entry = ModelCatalog(None).scan([(split_model(tmp_path), "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)
    try:
        first, second = await host.async_load(entry, 0, 3), await host.async_load(entry, 3, 6)
        loop = asyncio.get_running_loop()

        def run(hosted, sid, rows):
            import torch
            s = hosted.model.new_session(sid)
            inputs = torch.tensor([5] * rows) if hosted.start == 0 else torch.zeros(rows, 64)
            hosted.model.forward(s, inputs, 0)
            return s.nbytes
        size = await loop.run_in_executor(first.executor, run, first, "kept", 4)
        first.model.sessions.keep("kept", COORD)
        assert await loop.run_in_executor(second.executor, run, second, "busy", 4) == size
        host.kv_budget_bytes = int(1.5 * size)  # room for one: the kept one, in the first slice, goes
        assert await host.async_sweep() == ["kept"]
        assert "busy" in second.model.sessions and host.kept_count() == 0
    finally:
        await host.async_close()


async def test_steps_still_queued_when_their_slice_unloads_fail_at_once(worker):
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    gate = asyncio.get_running_loop().create_future()
    blocker = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: gate_wait(gate))
    from node import const
    n = const.BATCH_MAX_STEPS + 4
    for i in range(n):
        work = Work(sid=f"u{i}", model=entry.sha256, seq=0, index_pos=0, n_tokens=2, route=(Hop(ME, 0, entry.n_layers),),
                    hop=0, coordinator=COORD, sample=True, sampling=SamplingParams(temperature=0.0))
        w.on_work(work.to_header(), encode_tokens([3 + i, 4]), COORD)
    unload = asyncio.create_task(w.host.async_unload(hosted))  # its free queues behind the first batch
    await asyncio.sleep(0)
    gate.get_loop().call_soon_threadsafe(gate.set_result, None)
    await blocker
    await unload
    await wait_until(lambda: len(_results(peers)) == n, 10, what="a RESULT for every step")
    codes = [r.error_code for r in _results(peers)]  # (the unload marks the slice at once: none computes)
    assert set(codes) <= {None, "segment_not_served"} and "segment_not_served" in codes, codes
    assert not hosted.step_queue.items and not hosted.step_queue.scheduled


async def test_a_coordinators_sessions_in_use_go_with_its_link_and_its_kept_ones_stay(worker):
    """A coordinator SIGKILLed mid-stream left its sessions on the segments, KV held for nobody
    until the TTL (300 s; a swarm test, 2026-12-06). Its link going drops the ones in use (it fails
    those attempts over with new sessions); a kept one stays for its next turn; another
    coordinator's stay."""
    from types import SimpleNamespace

    w, entry, peers = worker
    hosted, _ = await _kept_turn(worker)  # s1: kept for COORD
    for sid, coordinator in (("s2", COORD), ("s3", NEXT)):
        w.on_work(_first_step(entry, sid, 0, [5, 6, 7], coordinator=coordinator).to_header(),
                  encode_tokens([5, 6, 7]), coordinator)
    await wait_until(lambda: len(_results(peers)) == 3, 30, what="both sessions' first step")
    assert hosted.model.sessions.counts() == (2, 1)
    w._on_peer_event("changed", SimpleNamespace(node_id=COORD, state="connected"))  # nothing happens
    w._on_peer_event("changed", SimpleNamespace(node_id=COORD, state="gone"))
    await wait_until(lambda: hosted.model.sessions.counts() == (1, 1), 10, what="s2 dropped")
    assert "s1" in hosted.model.sessions and "s3" in hosted.model.sessions and "s2" not in hosted.model.sessions


def test_the_worker_watches_the_peer_links_it_serves():
    from node.inference.pipeline.transport import PipelineTransport
    from node.inference.pipeline.worker import SegmentWorker

    class Peers:
        callbacks: list = []

        def subscribe(self, callback):
            self.callbacks.append(callback)
            return lambda: None

        def register_handler(self, *_args, **_kwargs):
            pass

    peers = Peers()
    w = SegmentWorker(ME, SliceHost(dtype="f32"), PipelineTransport(ME, peers))
    w.register()
    assert peers.callbacks == [w._on_peer_event]


async def test_a_coordinator_back_as_a_new_process_loses_its_kept_sessions_and_a_relinked_one_keeps_them(worker):
    """The same boot_id after a lost link (the same process): kept sessions stay for its next
    turn. Another boot_id (it restarted, its prefix cache is gone): its sessions, kept ones too,
    are freed at once; another coordinator's stay (test_coordinator_restart.py: real nodes)."""
    from types import SimpleNamespace

    w, entry, peers = worker
    hosted, _ = await _kept_turn(worker)  # s1: kept for COORD
    w.on_work(_first_step(entry, "s3", 0, [5, 6, 7], coordinator=NEXT).to_header(), encode_tokens([5, 6, 7]), NEXT)
    await wait_until(lambda: len(_results(peers)) == 2, 30, what="s3's first step")
    for state, boot in (("connected", "one"), ("gone", "one"), ("connected", "one")):
        w._on_peer_event("changed", SimpleNamespace(node_id=COORD, state=state, boot_id=boot))
    w._on_peer_event("changed", SimpleNamespace(node_id=NEXT, state="connected", boot_id="other"))
    await asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: None)  # after any free
    assert hosted.model.sessions.counts() == (1, 1)
    w._on_peer_event("changed", SimpleNamespace(node_id=COORD, state="connected", boot_id="two"))
    await wait_until(lambda: hosted.model.sessions.counts() == (1, 0), 10, what="s1 freed")
    assert "s3" in hosted.model.sessions


async def test_session_controls_from_a_node_that_is_not_the_coordinator_are_charged_and_logged_once(worker, caplog):
    """Found in review: a segment on another coordinator's route sees its session ids in the WORK
    it forwards; its CANCELs naming them were dropped before the sender's budget was charged, with a
    WARNING each: 5,000 frames, 5,000 lines, none counted as dropped."""
    w, entry, peers = worker
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: _results(peers), 30, what="RESULT")
    flood = 5000
    for _ in range(flood):
        w.on_cancel(SessionControl("s1", entry.sha256, "cancel").to_header(), b"", NEXT)
    assert caplog.text.count("not the session's coordinator dropped") == 1
    assert caplog.text.count("session controls dropped, the sender is past its budget") == 1
    assert w.control_budget.dropped >= flood - 2 * const.SESSION_CONTROL_BURST
    assert w.host.session_count() == 1  # still the coordinator's
