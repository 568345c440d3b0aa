"""AutoServe's move protocol on a real SliceHost (tiny model, in this process) with a scripted peer
view: load the new range first, re-check before dropping the old one, drain, free."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from node import const
from node.inference.pipeline.autoserve import AutoServe
from node.inference.pipeline.host import SliceHost
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from tests.support.helpserve import quick_choice
from tests.support.waiting import wait_until

SPEC = SynthSpec(n_layers=8, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256, name="mv8")


class ScriptedPeers:
    """A PeerView whose snapshots the test sets."""

    def __init__(self):
        self.snaps = []
        self.observers = []

    def peers(self):
        return list(self.snaps)

    def subscribe(self, callback):
        self.observers.append(callback)
        return lambda: self.observers.remove(callback)


def peer(node_id, start, end, sha):
    return SimpleNamespace(node_id=node_id, state="connected", models=(
        {"sha256": sha, "name": "mv8", "n_layers": 8, "start": start, "end": end, "ms_per_layer": None},))


class HookedHost(SliceHost):
    """Runs `after_load` once a slice has loaded (the swarm changes while we load)."""

    after_load = None

    async def async_load(self, entry, start, end, **kw):
        hosted = await super().async_load(entry, start, end, **kw)
        if self.after_load is not None:
            self.after_load(start, end)
        return hosted


async def setup(tmp_path):
    path = tmp_path / "mv8.gguf"
    write_gguf(path, SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    host = HookedHost(dtype="f32", kv_dtype="f32")
    peers = ScriptedPeers()
    announced = []

    async def announce():
        announced.append([(a["start"], a["end"]) for a in host.adverts()])

    auto = AutoServe("me" * 32, host, peers, [entry], announce=announce, budget_mb=1)
    model = auto.models[0]
    await auto._async_budget(model, asyncio.get_running_loop())
    assert (model.budget.layers, model.budget.with_head) == (4, 4)  # 1 MiB: half the model
    old = await host.async_load(entry, 4, 8, auto_budget=(4, 4))
    return entry, host, peers, auto, model, old, announced


@pytest.mark.asyncio
async def test_a_move_that_would_leave_its_old_layers_bare_is_aborted(tmp_path):
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    sha = entry.sha256
    # 0-3 has one holder, 4-7 three (me + two manual nodes): moving me to 0-3 gains a holder
    peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 4, 8, sha), peer("p2" * 32, 4, 8, sha)]

    def both_leave(start, end):
        if (start, end) == (0, 4):
            peers.snaps = [peers.snaps[0]]  # while we loaded 0-3, the other holders of 4-7 left

    host.after_load = both_leave
    await auto._async_evaluate(model, "test")
    assert [(s.start, s.end, s.state) for s in host.slices.values()] == [(4, 8, "loaded")]
    assert "range=4-7" in auto.decisions[-1] and "reason=move_aborted:layers_4-7_would_have_no_holder" in \
        auto.decisions[-1]
    assert "reason=test:move_from_4-7:clear_gain" in auto.decisions[-2]
    assert announced[-1] == [(4, 8)]
    await host.async_close()


@pytest.mark.asyncio
async def test_a_move_drains_the_old_range_until_its_session_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "AUTO_SERVE_DRAIN_POLL_S", 0.05)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    sha = entry.sha256
    peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 4, 8, sha), peer("p2" * 32, 4, 8, sha)]
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(old.executor, old.model.new_session, "busy")
    await auto._async_evaluate(model, "test")
    # the new range serves and is announced; the old one is no longer advertised but still runs
    assert host.find(sha, 0, 4) is not None and announced[-1] == [(0, 4)]
    assert host.find(sha, 4, 8) is old and old.state == "draining"
    assert [(s.start, s.end) for s in host.for_model(sha)] == [(0, 4)]
    assert (4, 8) in [(s.start, s.end) for s in host.for_model(sha, draining=True)]
    await loop.run_in_executor(old.executor, old.model.free_session, "busy")
    # (find() forgets the slice at once; its weights go on its executor just after)
    await wait_until(lambda: host.find(sha, 4, 8) is None and old.model is None, 10.0, 0.05,
                     "the drained range to be freed")
    assert old.state == "unloaded"
    # a second look: nothing more to gain, nothing moves
    decisions = len(auto.decisions)
    peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 4, 8, sha), peer("p2" * 32, 4, 8, sha)]
    await auto._async_evaluate(model, "test")
    assert len(auto.decisions) == decisions
    await auto.async_stop()
    await host.async_close()


@pytest.mark.asyncio
async def test_the_same_range_chosen_while_it_drains_is_kept_not_loaded_twice(tmp_path, monkeypatch):
    """A pause, then a resume within the drain grace period that picks the same layers: the
    draining slice serves again with its sessions (before, a second copy replaced it in the host,
    its peers' sessions failed and its weights were held twice until the grace period ended)."""
    monkeypatch.setattr(const, "AUTO_SERVE_DRAIN_POLL_S", 0.05)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    sha = entry.sha256
    peers.snaps = [peer("p0" * 32, 0, 4, sha)]  # 4-7 is this node's alone: the choice is 4-7 again
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(old.executor, old.model.new_session, "busy")
    await auto.async_pause()
    assert old.state == "draining" and host.for_model(sha) == [] and announced[-1] == []
    auto.resume()
    await auto._async_evaluate(model, "resumed")
    assert host.find(sha, 4, 8) is old and old.state == "loaded" and len(host.slices) == 1
    assert "busy" in old.model.sessions
    assert announced[-1] == [(4, 8)]
    await loop.run_in_executor(old.executor, old.model.free_session, "busy")
    # the pause's free task sees the slice chosen again and leaves it serving
    await wait_until(lambda: not auto._drains, 10.0, 0.05, "the pause's release task to end")
    assert old.state == "loaded" and old.model is not None and host.find(sha, 4, 8) is old
    await auto.async_stop()
    await host.async_close()


@pytest.mark.asyncio
async def test_a_kept_slice_given_up_by_a_choice_drains_its_sessions_first(tmp_path, monkeypatch):
    """A move or first choice that loads a range and then gives it up unloads a fresh slice at once;
    the same call on a draining slice kept for that range (it runs sessions) drains it instead."""
    monkeypatch.setattr(const, "AUTO_SERVE_DRAIN_POLL_S", 0.05)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    sha = entry.sha256
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(old.executor, old.model.new_session, "busy")
    host.drain(old)
    kept = await host.async_load(entry, 4, 8, auto_budget=(4, 4))
    assert kept is old and old.state == "loaded"
    await auto._async_give_up(kept)
    assert old.state == "draining" and old.model is not None and "busy" in old.model.sessions
    await loop.run_in_executor(old.executor, old.model.free_session, "busy")
    await wait_until(lambda: old.state == "unloaded", 10.0, 0.05, "the given-up slice freed once idle")
    fresh = await host.async_load(entry, 0, 4, auto_budget=(4, 4))
    await auto._async_give_up(fresh)  # no sessions: unloaded at once
    assert fresh.state == "unloaded" and host.find(sha, 0, 4) is None
    await auto.async_stop()
    await host.async_close()


@pytest.mark.asyncio
async def test_first_choice_then_periodic_and_peer_triggered_moves(tmp_path, monkeypatch):
    quick_choice(monkeypatch, drain_poll_s=0.05)
    path = tmp_path / "mv8.gguf"
    write_gguf(path, SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    sha = entry.sha256
    host = SliceHost(dtype="f32", kv_dtype="f32")
    peers = ScriptedPeers()
    peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 0, 4, sha)]
    auto = AutoServe("me" * 32, host, peers, [entry], announce=_nothing, budget_mb=1, reevaluate_s=0.3)
    auto.start()
    try:
        # the first choice takes the uncovered half
        await wait_until(lambda: auto.settled and host.find(sha, 4, 8), 30.0, 0.05, "the first choice")
        assert "range=4-7" in auto.decisions[0] and "reason=start:weakest_coverage" in auto.decisions[0]
        assert "coverage_before=2x4,0x4" in auto.decisions[0] and "coverage_after=2x4,1x4" in auto.decisions[0]
        # adverts change without any peer event (as a re-measured speed would): only the periodic
        # re-evaluation can see that 4-7 now has three holders and 0-3 one
        peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p2" * 32, 4, 8, sha), peer("p3" * 32, 4, 8, sha)]
        await wait_until(lambda: host.find(sha, 0, 4) and not host.find(sha, 4, 8), 30.0, 0.05,
                         "a periodic re-evaluation to move to 0-3")
        assert "reason=periodic:move_from_4-7:clear_gain" in auto.decisions[1]
        # a peer event: 0-3's other holder leaves and 4-7 is down to one; nothing to gain by moving
        # back (it would uncover 0-3), so nothing moves
        peers.snaps = [peer("p2" * 32, 4, 8, sha)]
        for callback in list(peers.observers):
            callback("changed", peers.snaps[0])
        n = len(auto.decisions)
        await wait_until(lambda: auto._wake.is_set() is False, 5.0, 0.01, "the chooser to take the event")
        assert len(auto.decisions) == n and host.find(sha, 0, 4)
    finally:
        await auto.async_stop()
        await host.async_close()


async def _nothing():
    return None


def test_a_sweep_racing_an_unload_and_a_failing_sweep_keep_the_sweeper(tmp_path, monkeypatch):
    async def go():
        path = tmp_path / "mv8.gguf"
        write_gguf(path, SPEC)
        entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
        host = SliceHost(dtype="f32", kv_dtype="f32")
        try:
            hosted = await host.async_load(entry, 0, 4)
            hosted.model.new_session("s1")
            # the sweep runs on the slice's executor; the unload's free() queues behind it and
            # clears hosted.model before the sweep's coroutine resumes
            await asyncio.gather(host.async_sweep(), host.async_unload(hosted))
            assert hosted.model is None and host.slices == {}
            await host.async_sweep()  # nothing left; an unloaded slice's shut executor is not used

            calls = []

            async def flaky():
                calls.append(1)
                if len(calls) == 1:
                    raise RuntimeError("a sweep that fails")
                return []
            monkeypatch.setattr(const, "SESSION_SWEEP_INTERVAL_S", 0.01)
            monkeypatch.setattr(host, "async_sweep", flaky)
            sweeper = asyncio.create_task(host._async_sweep_loop())
            await wait_until(lambda: len(calls) >= 3, 5.0, 0.01, "the sweeper to go on after a failure")
            sweeper.cancel()
        finally:
            await host.async_close()
    asyncio.run(go())


@pytest.mark.asyncio
async def test_a_first_mover_that_never_moves_stalls_nobody_for_ever(tmp_path):
    """Every node computes the same first mover from the same adverts; one that never moves (its
    view differs, or it lies about its budget) is waited for AUTO_SERVE_DEFER_ROUNDS rounds only."""
    from node.inference.pipeline import layerchoice as lc
    from node.inference.pipeline.coverage import swarm_coverage

    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    sha = entry.sha256
    for i in range(50):  # a peer id the seeded hash puts before this node
        lazy = f"{i:02d}" * 32
        snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 4, 8, sha), peer(lazy, 4, 8, sha)]
        snaps[2].models[0]["auto_budget"] = [4, 4]
        cov = swarm_coverage(auto.node_id, host.adverts(), snaps)[sha]
        found = lc.first_mover(8, cov.spans, {**cov.budgets, auto.node_id: model.budget}, model.seed)
        if found is not None and found[0] == lazy:
            break
    else:
        pytest.fail("no peer id of 50 ranks before this node as first mover")
    peers.snaps = snaps
    for _ in range(const.AUTO_SERVE_DEFER_ROUNDS):
        await auto._async_evaluate(model, "periodic")
        assert host.find(sha, 4, 8) is old and host.find(sha, 0, 4) is None  # waiting for the lazy one
    await auto._async_evaluate(model, "periodic")
    assert host.find(sha, 0, 4) is not None  # it moved on its own
    assert "move_from_4-7" in auto.decisions[-1]
    await auto.async_stop()
    await host.async_close()


@pytest.mark.asyncio
async def test_without_memory_for_both_ranges_a_move_drops_the_old_one_first(tmp_path, monkeypatch):
    from node.inference.pipeline import moves

    monkeypatch.setattr(const, "AUTO_SERVE_DRAIN_POLL_S", 0.05)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    monkeypatch.setattr(moves, "default_budget_bytes", lambda: 0)  # the machine has no room to spare
    sha = entry.sha256
    peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 4, 8, sha), peer("p2" * 32, 4, 8, sha)]
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(old.executor, old.model.new_session, "busy")
    move = asyncio.create_task(auto._async_evaluate(model, "test"))
    await wait_until(lambda: old.state == "draining", 10.0, 0.01, "the old range to stop being offered")
    assert host.find(sha, 0, 4) is None  # nothing new is loaded while the old range still runs
    assert announced[-1] == []
    await loop.run_in_executor(old.executor, old.model.free_session, "busy")
    await asyncio.wait_for(move, 30.0)
    assert old.state == "unloaded" and host.find(sha, 0, 4) is not None
    assert announced[-1] == [(0, 4)]
    await auto.async_stop()
    await host.async_close()


class FailingHost(SliceHost):
    """Its first `fails` loads fail (as an unreachable origin makes them)."""

    fails = 2

    async def async_load(self, entry, start, end, **kw):
        hosted = await super().async_load(entry, start, end, **kw)
        if self.fails > 0:
            self.fails -= 1
            hosted.state = "failed"
        return hosted


@pytest.mark.asyncio
async def test_a_failed_load_is_chosen_again_soon_not_at_the_periodic_round(tmp_path, monkeypatch, caplog):
    """A slice whose parts could not be fetched waited for the periodic round (~2 min; a swarm
    test, 2026-12-06: every request a 503 meanwhile, the origin back at once). Now it is chosen
    again after AUTO_SERVE_RETRY_MIN_S, doubling."""
    import logging

    quick_choice(monkeypatch, retry_min_s=0.1)
    path = write_gguf(tmp_path / "mv8.gguf", SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    host = FailingHost(dtype="f32", kv_dtype="f32")
    auto = AutoServe("me" * 32, host, ScriptedPeers(), [entry], announce=_nothing, budget_mb=1, reevaluate_s=600)
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.autoserve")
    auto.start()
    try:
        await wait_until(lambda: any(h.state == "loaded" for h in host.for_model(entry.sha256)), 20.0, 0.05,
                         "the slice, two failed loads later")
        assert host.fails == 0 and auto.models[0].failures == 0
        retries = [r.getMessage() for r in caplog.records if "slice load failed, choosing again soon" in r.getMessage()]
        assert len(retries) == 2 and "retry_in_s=0.1" in retries[0] and "retry_in_s=0.2" in retries[1]
        assert sum("reason=retry:" in d for d in auto.decisions) == 2
    finally:
        await auto.async_stop()
        await host.async_close()


@pytest.mark.asyncio
async def test_a_failed_choice_is_kept_until_a_later_choice_loads(tmp_path, monkeypatch):
    """The failed slice is unloaded at once; its failure (layers, reason, next choice) is kept for
    the app, diagnostics and the admin API until a later choice of the model loads (2026-12-07)."""
    quick_choice(monkeypatch, retry_min_s=0.5)
    path = write_gguf(tmp_path / "mv8.gguf", SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    host = FailingHost(dtype="f32", kv_dtype="f32")
    host.fails = 1
    auto = AutoServe("me" * 32, host, ScriptedPeers(), [entry], announce=_nothing, budget_mb=1, reevaluate_s=600)
    auto.start()
    try:
        await wait_until(lambda: auto.failures(), 20.0, 0.01, "the first load to fail")
        [failure] = auto.failures()
        assert failure.model == entry.id and failure.failures == 1 and failure.end > failure.start
        assert failure.retry_at > failure.at and failure.reason
        assert f"layers {failure.start}–{failure.end - 1} of {entry.id}" in failure.text()
        # (the failure is over once the choosing task counts the load: a step after the host's "loaded")
        await wait_until(lambda: any(h.state == "loaded" for h in host.for_model(entry.sha256))
                         and auto.failures() == [], 20.0, 0.05, "the slice, one failed load later")
    finally:
        await auto.async_stop()
        await host.async_close()


@pytest.mark.asyncio
async def test_a_reloaded_slice_starts_from_this_machines_measured_speed(tmp_path):
    """After a re-budget reloaded its slice, a coordinator sent its own layers to a peer: the new
    slice was unmeasured (the planner's default 2 ms/layer) against a measured peer, so never
    used, so never measured (a swarm test, 2026-12-06). A slice now starts from the speed this
    machine measured on the model, beside it or before it; one never measured starts unmeasured."""
    from node.inference.pipeline.holders import LayerHolders
    from node.inference.pipeline.perf import PeerPerformance

    path = write_gguf(tmp_path / "mv8.gguf", SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    host = SliceHost(dtype="f32", kv_dtype="f32")
    try:
        first = await host.async_load(entry, 0, 4)
        assert first.ms_per_layer is None
        for _ in range(3):
            host.note_eval(first, 400, 1)  # 0.1 ms a layer
        beside = await host.async_load(entry, 4, 8)
        assert beside.ms_per_layer == pytest.approx(0.1)
        await host.async_unload(first)
        await host.async_unload(beside)
        again = await host.async_load(entry, 2, 6)
        assert again.ms_per_layer == pytest.approx(0.1) and again.advert()["ms_per_layer"] == 0.1
        holders = LayerHolders("me" * 32, host, None, None, PeerPerformance("me" * 32)).holders(entry.sha256)
        assert [h.ms_per_layer for h in holders] == [pytest.approx(0.1)]
    finally:
        await host.async_close()
