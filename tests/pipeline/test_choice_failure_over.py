"""A failed load of the automatic layer choice is shown until a later choice loads (2026-12-07);
these are the ways it stayed shown, "chosen again at" a time long past, when nothing would load
again (review r27): a new budget (one that fits no layer: the app stayed "error" with the stale
banner), a choice that then loads nothing (a failed move, its old range serving on), and a pause
landing just as the load failed (a failure and a retry timer kept after the pause cleared them)."""

from __future__ import annotations

import asyncio

import pytest

from node.inference.pipeline.autoserve import AutoServe
from node.inference.pipeline.host import SliceHost
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from tests.pipeline.test_autoserve_moves import SPEC, ScriptedPeers, peer
from tests.support.helpserve import quick_choice
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio

# ~4 MB a layer in f32: a 1 MB budget fits none of it, 200 MB all of it
WIDE = SynthSpec(n_layers=3, hidden=256, n_heads=4, n_kv_heads=2, ffn=1024, vocab=512, n_ctx=256, name="wide3")


class FailOnce(SliceHost):
    """Its next load fails when `fail_next` (as an unreachable origin makes it); `then` runs as it does."""

    fail_next = False
    then = None

    async def async_load(self, entry, start, end, **kw):
        hosted = await super().async_load(entry, start, end, **kw)
        if self.fail_next:
            self.fail_next = False
            hosted.state, hosted.error = "failed", "the origin went away"
            if self.then is not None:
                self.then()
        return hosted


async def _nothing():
    pass


@pytest.fixture
def quick(monkeypatch):
    quick_choice(monkeypatch, retry_min_s=0.2)


async def test_a_new_budget_ends_the_last_failure_and_one_fitting_no_layer_says_so(tmp_path, quick):
    path = write_gguf(tmp_path / "wide3.gguf", WIDE)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    host = FailOnce(dtype="f32", kv_dtype="f32")
    host.fail_next = True
    auto = AutoServe("me" * 32, host, ScriptedPeers(), [], announce=_nothing, reevaluate_s=600)
    changed = []
    auto.failures_changed.subscribe(lambda: changed.append(len(auto.failures())))
    auto.start()
    try:
        await auto.async_add(entry, 200)
        await wait_until(lambda: auto.failures(), 20.0, 0.01, "the load to fail")
        assert changed and changed[-1] == 1  # the app is told
        await auto.async_add(entry, 1)  # the user lowers the budget: 1 MB fits no layer
        assert auto.failures() == [] and changed[-1] == 0  # the old choice's failure is over
        model = auto.models[0]
        await wait_until(lambda: model.budget is not None and model.budget.layers == 0, 20.0, 0.02,
                         "the choice to find the budget fits no layer")
        assert auto.failures() == [] and host.for_model(entry.sha256) == []
    finally:
        await auto.async_stop()
        await host.async_close()


async def test_a_choice_that_then_loads_nothing_ends_a_failed_moves_failure(tmp_path):
    path = write_gguf(tmp_path / "mv8.gguf", SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    sha = entry.sha256
    host = FailOnce(dtype="f32", kv_dtype="f32")
    peers = ScriptedPeers()
    auto = AutoServe("me" * 32, host, peers, [entry], announce=_nothing, budget_mb=1, reevaluate_s=600)
    model = auto.models[0]
    await auto._async_budget(model, asyncio.get_running_loop())
    old = await host.async_load(entry, 4, 8, auto_budget=(4, 4))
    try:
        # 0-3 has one holder, 4-7 three (me + two others): a move to 0-3 gains a holder; its load fails
        peers.snaps = [peer("p0" * 32, 0, 4, sha), peer("p1" * 32, 4, 8, sha), peer("p2" * 32, 4, 8, sha)]
        host.fail_next = True
        await auto._async_evaluate(model, "test")
        assert old.state == "loaded" and [f.start for f in auto.failures()] == [0]  # the old range serves on
        # then another node takes 0-3: the next choice (the retry) finds no move and loads nothing
        peers.snaps = [*peers.snaps, peer("p3" * 32, 0, 4, sha)]
        decided = len(auto.decisions)
        await auto._async_evaluate(model, "retry")
        assert len(auto.decisions) == decided and old.state == "loaded"  # no move, nothing loaded
        assert auto.failures() == [] and model.last_failure is None  # not "chosen again at" a time past
    finally:
        await auto.async_stop()
        await host.async_close()


async def test_a_load_failing_as_a_pause_lands_keeps_no_failure_and_no_retry(tmp_path, quick):
    path = write_gguf(tmp_path / "mv8.gguf", SPEC)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    host = FailOnce(dtype="f32", kv_dtype="f32")
    auto = AutoServe("me" * 32, host, ScriptedPeers(), [entry], announce=_nothing, budget_mb=1, reevaluate_s=600)
    model = auto.models[0]
    await auto._async_budget(model, asyncio.get_running_loop())
    paused = []
    # the pause runs after the load has ended (failed) and before the choice reads the outcome
    host.then = lambda: paused.append(asyncio.get_running_loop().create_task(auto.async_pause()))
    host.fail_next = True
    try:
        await auto._async_evaluate(model, "start")
        await paused[0]
        assert auto.paused and model.last_failure is None and auto._retry is None
        assert host.for_model(entry.sha256) == []
    finally:
        await auto.async_stop()
        await host.async_close()
