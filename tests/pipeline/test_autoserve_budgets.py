"""AutoServe's budget on a real SliceHost (tiny models, in this process): the KV reserve of a layer
is for the context the node serves, models without a budget of their own share the node's and are
sized again when their number changes, and a load under way that no longer fits its share is
cancelled. The move protocol itself: test_autoserve_moves.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from node.contribute import Contributions
from node.inference.pipeline.autoserve import AutoServe
from node.inference.pipeline.coverage import slice_sizes
from node.inference.pipeline.host import SliceHost
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog, served_context
from node.node import Node
from tests.pipeline.test_autoserve_moves import SPEC, ScriptedPeers, _nothing
from tests.support.helpserve import quick_choice
from tests.support.nodes import node_config
from tests.support.waiting import wait_until


async def test_the_kv_reserve_of_auto_budgets_is_for_the_context_the_node_serves(tmp_path):
    """A model trained on 32768 positions, served at NodeConfig's max_ctx (8192, as the local route
    serves it): AutoServe's budget and the contribution offer reserve KV for 8192 positions a
    layer, not 32768 (a real Llama 3's 131072 made that reserve 4.4 times a 1B model's int8 weights
    in f16, 8.8 times in f32); a session may still grow to the trained context."""

    long_ctx = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=32768,
                         name="long2")
    path = write_gguf(tmp_path / "long2.gguf", long_ctx)
    entry = (await ModelCatalog(tmp_path).async_scan([(path, "cli")]))[0]
    assert entry.context_length == 32768
    host = SliceHost(dtype="f32", kv_dtype="f16", ctx_cap=8192)
    assert host.context_for(entry) == served_context(32768, 0, 8192) == 8192
    assert SliceHost(dtype="f32", n_ctx=4096, ctx_cap=8192).context_for(entry) == 4096  # n_ctx wins
    assert SliceHost(dtype="f32").context_for(entry) == 0  # nothing set: the trained context
    assert Node(node_config(tmp_path / "n", max_ctx=4096)).slice_host.context_for(entry) == 4096  # the config's
    reserve = 2 * 2 * 16 * 8192 * 2  # K and V, 2 kv heads x 16 dims, 8192 positions, f16
    assert slice_sizes(path, "f32", 0, kv_dtype="f16").kv_per_layer_bytes == 4 * reserve
    auto = AutoServe("me" * 32, host, ScriptedPeers(), [entry], announce=_nothing, budget_mb=1)
    await auto._async_budget(auto.models[0], asyncio.get_running_loop())
    assert auto.models[0].sizes.kv_per_layer_bytes == reserve
    here = SimpleNamespace(catalog=SimpleNamespace(resolve=lambda _: entry), slice_host=host)
    offer = await Contributions.async_layer_cost(here, entry.id)  # the budget slider's layer cost
    weights = slice_sizes(path, "f32", 8192, kv_dtype="f16").per_layer_bytes
    assert offer["per_layer_mb"] == (weights + reserve) / 2**20
    hosted = await host.async_load(entry, 0, 2)
    try:
        assert hosted.model.n_ctx == 32768  # sessions grow lazily; the budget bounds their sum
    finally:
        await host.async_close()


@pytest.mark.asyncio
async def test_models_share_the_node_budget_and_are_sized_again_when_one_leaves(tmp_path, caplog):
    """Two `--serve auto` models were each sized to the whole `--slice-budget-mb` (a swarm test,
    2026-12-06: 67 MB held against 60); now the models without a budget of their own share it, and
    each is sized again when their number changes. A model with its own budget keeps it."""
    import logging

    entries = []
    for name in ("sa8", "sb8"):
        path = write_gguf(tmp_path / f"{name}.gguf", SynthSpec(**{**SPEC.__dict__, "name": name}))
        entries += await ModelCatalog(tmp_path).async_scan([(path, "cli")])
    host = SliceHost(dtype="f32", kv_dtype="f32")
    auto = AutoServe("me" * 32, host, ScriptedPeers(), entries, announce=_nothing, budget_mb=2)
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.INFO, logger="node.inference.pipeline.autoserve"):
        for m in auto.models:
            await auto._async_budget(m, loop)
    assert [(m.budget_mb, m.budget.layers) for m in auto.models] == [(1, 4), (1, 4)]  # half each: 1 MiB, 4 layers
    assert caplog.text.count("shared_by=2") == 2
    await auto.async_remove(entries[1].sha256)
    (alone,) = auto.models
    # sized again: the whole model (1.75 MiB of the 2: its share is capped at what it can use)
    assert (alone.budget_mb, alone.budget.layers, alone.budget.with_head) == (1, 8, 8)
    await auto.async_add(entries[1], budget_mb=1)  # its own budget: the other keeps the node's
    assert alone.budget is not None and auto.model(entries[1].sha256).budget_mb_override == 1
    await auto.async_remove(entries[1].sha256)
    # a slice that still fits its new share stays; one that does not is freed and chosen again
    half = await host.async_load(entries[0], 4, 8, auto_budget=(4, 4))
    await auto.async_add(entries[1])  # two share again: 4 layers each; 4-7 fits
    assert half.state == "loaded" and alone.budget.layers == 4
    await auto.async_remove(entries[1].sha256)
    await host.async_unload(half)
    whole = await host.async_load(entries[0], 0, 8, auto_budget=(8, 8))
    await auto.async_add(entries[1])
    assert whole.state in ("draining", "unloaded") and alone.budget is None and not alone.settled
    await auto.async_stop()
    await host.async_close()


@pytest.mark.asyncio
async def test_a_load_under_way_too_big_for_a_new_share_is_cancelled(tmp_path, monkeypatch):
    """Re-sharing looked at loaded slices only: a model loading its whole budget's range while a
    second model came finished that load, and the node held 1.5 times its budget (a review,
    2026-12-06). A load under way that no longer fits its share is cancelled and chosen again."""
    import threading

    from node.inference.slice import SliceModel

    quick_choice(monkeypatch)
    gate, real_load = threading.Event(), SliceModel.load

    def held_load(*args, **kwargs):
        gate.wait(30)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(SliceModel, "load", staticmethod(held_load))
    entries = []
    for name in ("la8", "lb8"):
        path = write_gguf(tmp_path / f"{name}.gguf", SynthSpec(**{**SPEC.__dict__, "name": name}))
        entries += await ModelCatalog(tmp_path).async_scan([(path, "cli")])
    host = SliceHost(dtype="f32", kv_dtype="f32")
    auto = AutoServe("me" * 32, host, ScriptedPeers(), entries[:1], announce=_nothing, budget_mb=2)
    auto.start()
    try:
        await wait_until(lambda: any(s.state == "loading" and (s.start, s.end) == (0, 8) for s in host.slices.values()),
                         20.0, 0.02, "the whole model to be loading")
        await auto.async_add(entries[1])  # two share now: 4 layers each
        gate.set()
        await wait_until(lambda: not any((s.start, s.end) == (0, 8) for s in host.slices.values()
                                         if s.state in ("loading", "loaded")), 20.0, 0.05, "the 0-7 load to go")
        await wait_until(lambda: all(sum(s.end - s.start for s in host.for_model(e.sha256)) == 4 for e in entries),
                         30.0, 0.05, "4 layers of each")
    finally:
        gate.set()
        await auto.async_stop()
        await host.async_close()
