"""Unticking "Help serve" (the Swarm tab, or `POST /api/admin/contribute {"stop": true}`) of a model
the node was started with `--serve auto` (2026-12-07): the untick removed the model from the layer
choice altogether, its slice freed and nothing of it chosen again until a restart, though the
command line still said `--serve auto`. Unticking now ends the Help-serve budget only: the model goes
back to `--serve auto`'s choice at the node's budget and is served again."""

from __future__ import annotations

import threading

import aiohttp
import pytest

from node import const
from node.inference.pipeline import budgets
from tests.support.helpserve import loaded, quick_choice
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


async def _contribute(node, body: dict) -> dict:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as s, \
            s.post(f"http://127.0.0.1:{node.api.port}/api/admin/contribute", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_unticking_help_serve_of_a_serve_auto_model_goes_back_to_the_automatic_choice(tmp_path, monkeypatch):
    quick_choice(monkeypatch)
    path = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", path, serve="auto", serve_reevaluate_s=1.0)) as node:
        entry = node.catalog.resolve("tiny")
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="--serve auto's first choice to load")
        await _contribute(node, {"model": entry.id, "budget_mb": 512})
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.budget_mb_override == 512
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the Help-serve budget's choice to load")
        summary = await _contribute(node, {"model": entry.id, "stop": True})
        assert summary["models"] == [], summary  # the Help-serve row is gone
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.at_start, "the --serve auto model left the layer choice"
        assert m.budget_mb_override is None  # the node's budget again
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="--serve auto's choice to serve it again")
        # ticked again: a Help-serve budget again, chosen by the same model
        await _contribute(node, {"model": entry.id, "budget_mb": 256})
        assert node.autoserve.model(entry.sha256).budget_mb_override == 256
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the new budget's choice to load")


async def test_unticking_a_serve_auto_url_model_whose_origin_answered_late_keeps_it_chosen(tmp_path, monkeypatch):
    """A `--serve auto --model URL` whose origin answered after the start's wait is opened in the
    background and given to the choice then (review r42: as an added model, which the untick removed
    from the choice until a restart, the bug the test above fixed for a model opened at start)."""
    quick_choice(monkeypatch)
    monkeypatch.setattr(const, "PARTIAL_START_OPEN_WAIT_S", 0.2)
    data = tiny_model(tmp_path).read_bytes()
    with ThreadedOrigin(data, name="late.gguf") as origin:
        origin.hold_answers = True
        async with running_node(node_config(tmp_path / "data", origin.url, serve="auto",
                                            serve_reevaluate_s=1.0)) as node:
            origin.release.set()  # the origin answers after the start: the open ends in the background
            entry = await wait_until(lambda: next((e for e in node.catalog.entries.values()
                                                   if e.partial is not None and node.autoserve.model(e.sha256)), None),
                                     20.0, what="the late --model URL to be given to the layer choice")
            assert not node.autoserve.model(entry.sha256).at_start  # (opened after the start, in the background)
            await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="--serve auto's first choice to load")
            await _contribute(node, {"model": entry.id, "budget_mb": 512})
            await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the Help-serve budget's choice to load")
            summary = await _contribute(node, {"model": entry.id, "stop": True})
            assert summary["models"] == [], summary
            m = node.autoserve.model(entry.sha256)
            assert m is not None, "the late --serve auto model left the layer choice"
            assert m.budget_mb_override is None
            await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="--serve auto's choice to serve it again")


async def test_unticking_help_serve_at_free_memory_keeps_the_serving_slice(tmp_path, monkeypatch):
    """Help serve ticked at 0 ("free memory") on a `--serve auto` model shares the node's budget as
    the automatic choice does: the untick changes no budget, and its slice serves on (review r42: it
    was drained, freed and the same layers loaded again)."""
    quick_choice(monkeypatch)
    path = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", path, serve="auto", serve_reevaluate_s=30.0)) as node:
        entry = node.catalog.resolve("tiny")
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="--serve auto's first choice to load")
        await _contribute(node, {"model": entry.id, "budget_mb": 0})
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the free-memory choice to load")
        serving = node.slice_host.for_model(entry.sha256)
        assert len(serving) == 1
        summary = await _contribute(node, {"model": entry.id, "stop": True})
        assert summary["models"] == [], summary
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.budget_mb_override is None and m.budget is not None
        assert serving[0].state == "loaded", serving[0].state  # not draining: no reload
        assert node.slice_host.for_model(entry.sha256) == serving


async def test_a_budget_set_while_the_untick_sizes_the_model_is_the_one_applied(tmp_path, monkeypatch):
    """Untick a `--serve auto` model, then tick it again at 256 MiB while the untick's sizing reads the
    node's free memory (in an executor; slow on a busy machine): the new budget is the one chosen
    within (review r42: the sizing ended after the re-tick and wrote the node budget's figure, and the
    256 MiB cap was not applied until the next change)."""
    quick_choice(monkeypatch)
    entered, go = threading.Event(), threading.Event()
    gated = threading.Event()  # set: the next read of free memory waits for `go`
    real = budgets.default_budget_bytes

    def free_memory() -> int:
        if gated.is_set():
            gated.clear()
            entered.set()
            go.wait(30.0)
        return real()

    monkeypatch.setattr(budgets, "default_budget_bytes", free_memory)
    path = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", path, serve="auto", serve_reevaluate_s=30.0)) as node:
        try:
            entry = node.catalog.resolve("tiny")
            await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="--serve auto's first choice to load")
            await _contribute(node, {"model": entry.id, "budget_mb": 512})
            await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the 512 MiB choice to load")
            m = node.autoserve.model(entry.sha256)
            gated.set()
            await _contribute(node, {"model": entry.id, "stop": True})
            await wait_until(entered.is_set, 20.0, what="the untick's sizing to read free memory")
            await _contribute(node, {"model": entry.id, "budget_mb": 256})
            assert m.budget is None and m.budget_mb_override == 256
        finally:
            go.set()
        await wait_until(lambda: m.budget is not None, 20.0, what="the model to be sized again")
        assert m.budget_mb == 256, m.budget_mb
        summary = node.contributions.summary()["models"]
        assert summary[0]["effective_budget_mb"] == 256, summary


async def test_a_help_serve_budget_kept_for_a_url_model_is_taken_up_when_it_opens_late(tmp_path, monkeypatch):
    """A `--serve auto --model URL` helped at 512 MiB (kept in config.toml), started again while its
    origin does not answer yet: the choice kept could not be restored at start (no such model yet),
    and the late open gave the model to the choice at the node's budget, the user's 512 lost until
    they ticked again (noticed in the review r42 fix, 2026-12-07). The kept budget is taken up."""
    quick_choice(monkeypatch)
    monkeypatch.setattr(const, "PARTIAL_START_OPEN_WAIT_S", 0.2)
    data = tiny_model(tmp_path).read_bytes()
    with ThreadedOrigin(data, name="late.gguf") as origin:
        config = node_config(tmp_path / "data", origin.url, serve="auto", serve_reevaluate_s=1.0)
        async with running_node(config) as node:
            entry = await wait_until(lambda: next((e for e in node.catalog.entries.values()
                                                   if e.partial is not None and node.autoserve.model(e.sha256)), None),
                                     20.0, what="the --model URL to be given to the layer choice")
            await _contribute(node, {"model": entry.id, "budget_mb": 512})
        assert entry.id in (tmp_path / "data" / "config.toml").read_text()  # kept for the next start
        origin.hold_answers = True
        async with running_node(node_config(tmp_path / "data", origin.url, serve="auto", serve_reevaluate_s=1.0,
                                            contribute_models={entry.id: 512})) as node:  # (as load_config reads it)
            origin.release.set()  # the origin answers after the start: the open ends in the background
            m = await wait_until(lambda: node.autoserve.model(entry.sha256), 20.0,
                                 what="the late --model URL to be given to the layer choice")
            assert not m.at_start  # (opened after the start)
            assert m.budget_mb_override == 512 and m.given
            assert [row["model"] for row in node.contributions.summary()["models"]] == [entry.id]
