"""How `--serve auto` splits the node's budget among the models without a budget of their own:
water-filling (each an equal part, capped at what it can use: all its layers, the head and their
KV reserve; what a capped model leaves goes to the others, again and again). An equal split gave a
1.3 GB model and a 7 GB one 4 GB each of 8 GB: 2.7 GB sat idle while the big model, across a swarm
of such nodes, was left with layers nobody held (2026-12-06)."""

from __future__ import annotations

import asyncio
import logging
import re
from types import SimpleNamespace

import pytest

from node import const
from node.inference.pipeline.autoserve import AutoServe
from node.inference.pipeline.coverage import slice_sizes
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.layerchoice import LayerBudget, layers_for_budget
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

MB = 2**20
# f32 weights and caches: a layer is 0.2 MiB with its KV reserve, the head 0.125 MiB
SHAPE = dict(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256)


def test_water_fill_caps_each_share_at_its_need_and_shares_what_is_left():
    from node.inference.pipeline.budgets import water_fill

    assert water_fill(8000, [1300, 7000]) == [1300, 6700]  # the small model whole, the rest to the big
    assert water_fill(8000, [7000, 1300]) == [6700, 1300]  # (in the models' order)
    assert water_fill(8000, [5000, 7000]) == [4000, 4000]  # neither fits: equal parts, as before
    assert water_fill(8000, [1000, 2000]) == [1000, 2000]  # both fit whole: the rest stays free
    # again and again: 3000 each caps the first (1000), 3500 each then caps the second
    assert water_fill(9000, [1000, 3500, 10_000]) == [1000, 3500, 4500]
    assert water_fill(9000, [0, 20_000, 20_000]) == [0, 4500, 4500]  # a model that cannot be sized uses none
    assert water_fill(10, [100, 100, 100]) == [3, 3, 3]
    assert water_fill(0, [5, 5]) == [0, 0] and water_fill(100, []) == []
    for total, needs in ((8000, [1300, 7000, 2500, 400]), (123_457, [99_999, 1, 50_000, 7]), (50, [60] * 7)):
        shares = water_fill(total, needs)
        assert sum(shares) <= total and all(0 <= s <= n for s, n in zip(shares, needs, strict=True))
        # no share below another's unless it holds its whole need
        assert all(s == n or s >= max(shares) for s, n in zip(shares, needs, strict=True))


async def _entries(tmp_path, *layer_counts: int):
    out = []
    for n in layer_counts:
        path = await asyncio.to_thread(write_gguf, tmp_path / f"w{n}.gguf", SynthSpec(n_layers=n, name=f"w{n}", **SHAPE))
        out += await ModelCatalog(tmp_path).async_scan([(path, "cli")])
    return out


def _fit(budget_bytes: int, path) -> LayerBudget:
    s = slice_sizes(path, "f32", kv_dtype="f32")
    return layers_for_budget(budget_bytes, s.per_layer_bytes, s.kv_per_layer_bytes, s.head_bytes, n_layers=s.n_layers)


@pytest.mark.asyncio
async def test_a_small_model_leaves_what_it_cannot_use_to_a_big_one(tmp_path, caplog):
    """2 MiB for a 2-layer model (0.53 MiB whole) and an 8-layer one (1.75 MiB): halves gave the
    big one 4 layers and left 0.47 MiB idle; it now gets the 1.47 MiB the small one cannot use
    (7 layers, 6 with the head). Sized again as models come and go; an override keeps its own."""
    small, big, third = await _entries(tmp_path, 2, 8, 4)
    sizes = slice_sizes(small.path, "f32", kv_dtype="f32")
    whole_small = 2 * (sizes.per_layer_bytes + sizes.kv_per_layer_bytes) + sizes.head_bytes
    host = SliceHost(dtype="f32", kv_dtype="f32")
    peers = SimpleNamespace(peers=lambda: [], subscribe=lambda callback: (lambda: None))

    async def announce():
        return None

    auto = AutoServe("me" * 32, host, peers, [small, big], announce=announce, budget_mb=2)
    loop = asyncio.get_running_loop()
    s, b = auto.models
    try:
        with caplog.at_level(logging.INFO, logger="node.inference.pipeline.autoserve"):
            for m in auto.models:
                await auto._async_budget(m, loop)
        assert s.budget == LayerBudget(2, 2) and s.budget_mb == whole_small // MB
        assert b.budget == _fit(2 * MB - whole_small, big.path) == LayerBudget(7, 6)
        assert _fit(MB, big.path) == LayerBudget(4, 4)  # what the equal split gave it
        # the DIAG line says each share and why
        lines = [ln for ln in caplog.text.splitlines() if "DIAG: slice budget" in ln]
        assert re.search(r"model=\S*w2\S* budget_mb=0 share=whole_model shared_by=2 node_budget_mb=2 capped=1 ", lines[0])
        assert re.search(r"model=\S*w8\S* budget_mb=1 share=even shared_by=2 node_budget_mb=2 capped=1 "
                         r"whole_model_mb=1 layers=7 with_head=6 ", lines[1]), lines[1]

        # a model with its own budget keeps it and changes no one's share
        await auto.async_add(third, budget_mb=1)
        assert auto.model(third.sha256).budget_mb_override == 1
        assert b.budget == LayerBudget(7, 6) and s.budget == LayerBudget(2, 2)
        await auto.async_remove(third.sha256)

        # the small model leaves: the big one gets the whole 2 MiB (its whole model, with the head)
        await auto.async_remove(small.sha256)
        assert b.budget == LayerBudget(8, 8)
        held = await host.async_load(big, 0, 8, auto_budget=(8, 8))
        # it comes back (added while running): the whole model no longer fits the big one's share,
        # its slice is freed and chosen again within the share
        await auto.async_add(small)
        assert held.state in ("draining", "unloaded") and b.budget is None and not b.settled
        await auto._async_budget(b, loop)
        await auto._async_budget(auto.model(small.sha256), loop)
        assert b.budget == LayerBudget(7, 6) and auto.model(small.sha256).budget == LayerBudget(2, 2)
        # a slice that fits the new share stays
        await auto.async_remove(small.sha256)
        kept = await host.async_load(big, 0, 7, auto_budget=(8, 8))
        await auto.async_add(small)
        assert kept.state == "loaded" and b.budget == LayerBudget(7, 6)
    finally:
        await auto.async_stop()
        await host.async_close()


@pytest.mark.asyncio
async def test_a_serve_auto_node_gives_the_big_model_what_the_small_one_cannot_use(tmp_path, monkeypatch, caplog):
    """`swarmllm run --model small --model big --serve auto --slice-budget-mb 2`: the node holds
    the small model whole and 7 layers of the big one (it held 4, half the budget)."""
    for name, value in (("AUTO_SERVE_LOOK_S", 0.0), ("AUTO_SERVE_START_DELAY_S", 0.0)):
        monkeypatch.setattr(const, name, value)
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.autoserve")
    small, big = await asyncio.gather(*(asyncio.to_thread(write_gguf, tmp_path / f"w{n}.gguf",
                                                          SynthSpec(n_layers=n, name=f"w{n}", **SHAPE)) for n in (2, 8)))
    config = node_config(tmp_path / "data", small, big, serve="auto", slice_budget_mb=2, slice_dtype="f32",
                         slice_kv_dtype="f32", activation_bits=32)
    async with running_node(config) as node:
        def held():
            out = {}
            for s in node.slice_host.slices.values():
                if s.state == "loaded":
                    out.setdefault(s.entry.name, []).append((s.start, s.end))
            return out if len(out) == 2 else None
        ranges = await wait_until(held, 30.0, 0.05, "both models' layers loaded")
        assert ranges["w2"] == [(0, 2)]
        (start, end), = ranges["w8"]
        assert end - start == (6 if end == 8 else 7), ranges  # 4 with halves
        assert "share=whole_model" in caplog.text and "share=even" in caplog.text
