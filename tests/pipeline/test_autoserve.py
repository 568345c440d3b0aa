"""`--serve auto` on real nodes: four nodes started together choose their layers of an 8-layer
model (room for half each) until every layer has two holders; after SIGKILLs the survivors move
to cover every layer again, and the model is served with llama.cpp's greedy text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.inference.pipeline.coverage import slice_sizes
from node.inference.pipeline.layerchoice import layers_for_budget
from node.inference.synth import SynthSpec, write_gguf
from tests.pipeline.swarm import chat, llama_greedy, run, wait_for_route
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until, wait_until_sync

pytestmark = [pytest.mark.llama, pytest.mark.slow]

AUTO8 = SynthSpec(n_layers=8, hidden=128, n_heads=4, n_kv_heads=2, ffn=256, vocab=512, n_ctx=512, name="auto8")
BUDGET_MB = 4  # f32: 4 layers (weights + KV at 512 tokens) fit, with or without the head
REEVALUATE_S = 3.0


def auto_model(directory: Path) -> Path:
    path = directory / "auto8.gguf"
    if not path.exists():
        write_gguf(path, AUTO8)
    return path


def start_auto_node(base: Path, name: str, model: Path, bootstrap: list[int], budget_mb: int = BUDGET_MB) -> NodeProcess:
    args = ["--model", str(model), "--no-default-model", "--serve", "auto", "--slice-budget-mb", str(budget_mb),
            "--slice-dtype", "f32", "--slice-kv-dtype", "f32", "--activation-bits", "32", "--no-mdns",
            "--n-threads", "1"]  # f32 caches: the budget's geometry above (f16 ones fit a fifth layer)
    for port in bootstrap:
        args += ["--bootstrap", f"127.0.0.1:{port}"]
    return NodeProcess(base / name, args=args, env={"SWARMLLM_SERVE_REEVALUATE_S": str(REEVALUATE_S)})


def coverage_section(report: str) -> list[str]:
    lines = report.splitlines()
    start = lines.index("-- swarm coverage --") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("-- ")), len(lines))
    return [ln for ln in lines[start:end] if ln.strip()]


async def min_holders(proc: NodeProcess) -> int | None:
    """The coverage section's minimum holders per layer for auto8 (None before it lists it)."""
    section = coverage_section(await proc.async_get_text("/api/admin/diagnostics"))
    for line in section:
        m = re.match(r"auto8 \(8 layers, sha [0-9a-f]{8}\): min holders per layer (\d+)", line)
        if m:
            return int(m.group(1))
    return None


async def held(procs: list[NodeProcess]) -> dict[str, list[tuple[int, int]]]:
    """Each node's loaded auto8 slices, from its admin API."""
    out = {}
    for p in procs:
        data = await p.async_get_json("/api/admin/models")
        out[p.name] = [tuple(m["layers_held"]) for m in data["models"]
                       if m.get("layers_held") and m["name"] == "auto8" and m["state"] == "loaded"]
    return out


def per_layer(ranges: dict[str, list[tuple[int, int]]]) -> list[int]:
    counts = [0] * AUTO8.n_layers
    for spans in ranges.values():
        for start, end in spans:
            for layer in range(start, end):
                counts[layer] += 1
    return counts


def test_budget_is_half_the_model(tmp_path):
    sizes = slice_sizes(auto_model(tmp_path), "f32", kv_dtype="f32")
    budget = layers_for_budget(BUDGET_MB * 2**20, sizes.per_layer_bytes, sizes.kv_per_layer_bytes,
                               sizes.head_bytes, n_layers=AUTO8.n_layers)
    assert (budget.layers, budget.with_head) == (4, 4)
    assert sizes.kv_per_layer_bytes == 2 * 2 * 32 * AUTO8.n_ctx * 4  # K and V, 2 kv heads × 32 dims, f32
    half = slice_sizes(auto_model(tmp_path), "f32", kv_dtype="f16")  # the node's default caches
    assert half.kv_per_layer_bytes == sizes.kv_per_layer_bytes // 2
    assert half.per_layer_bytes == sizes.per_layer_bytes


def test_four_auto_nodes_reach_two_holders_then_survivors_recover(tmp_path):
    model = auto_model(tmp_path)
    first = start_auto_node(tmp_path, "n0", model, [])
    procs = [first] + [start_auto_node(tmp_path, f"n{i}", model, [first.peer_port]) for i in range(1, 4)]
    try:
        async def formed():
            for p in procs:
                await p.async_wait_ready()

            async def two_everywhere():
                if await min_holders(first) != 2:
                    return False
                ranges = await held(procs)
                return ranges if min(per_layer(ranges)) >= 2 else False
            return await wait_until(two_everywhere, 60.0, 0.5, "every layer of auto8 to have two holders")

        ranges = run(formed())
        assert all(len(r) == 1 and r[0][1] - r[0][0] == 4 for r in ranges.values()), ranges
        section = coverage_section(run(first.async_get_text("/api/admin/diagnostics")))
        assert "NO HOLDER" not in "\n".join(section)
        assert sum(1 for ln in section if re.match(r"  layers \d+-\d+: ", ln)) >= 2
        for p in procs:
            line = next(ln for ln in p.node_log().splitlines() if "DIAG: choosing layers" in ln)
            assert re.search(r"DIAG: choosing layers model=\S+ range=\d-\d budget_mb=4 coverage_before=\S+ "
                             r"coverage_after=\S+ reason=\S+", line), line

        # SIGKILL one holder of 0-3: the other holds it still (>= 1 everywhere, no move needed)
        by_range: dict[tuple[int, int], list[NodeProcess]] = {}
        for p in procs:
            by_range.setdefault(ranges[p.name][0], []).append(p)
        victim_range = next(iter(sorted(by_range)))
        first_victim, second_victim = by_range[victim_range]
        survivors = [p for p in procs if p not in (first_victim, second_victim)]
        first_victim.kill()
        observer = survivors[0]

        async def after_one():
            await wait_until(lambda: _min_is(observer, 1), 30.0, 0.5, "coverage to show the first kill")
        run(after_one())

        # SIGKILL the other: its layers have no holder until a survivor moves there (within the
        # patched re-evaluation period plus a load), which it may because the other survivor keeps
        # its old range covered
        marks = {p.name: len(p.node_log()) for p in survivors}
        second_victim.kill()
        live = [p for p in procs if p.alive()]

        async def recovered():
            async def one_everywhere():
                ranges = await held(live)
                return ranges if min(per_layer(ranges)) >= 1 and await _min_is(live[0], 1) else False
            return await wait_until(one_everywhere, 45.0, 0.5, "the survivors to cover every layer again")
        ranges = run(recovered())
        assert sorted(r[0] for r in ranges.values()) == [(0, 4), (4, 8)], ranges
        since = {p.name: p.node_log()[marks[p.name]:] for p in live}
        moved = [p for p in live if "move_from_" in since[p.name]]
        assert len(moved) == 1, [p.name for p in moved]  # one mover, the other keeps its range covered
        gone = "0-3" if victim_range == (0, 4) else "4-7"
        assert re.search(rf"DIAG: choosing layers model=\S+ range={gone} budget_mb=4 \S+ \S+ "
                         rf"reason=peer_(left|changed):move_from_\d-\d:clear_gain", since[moved[0].name])
        unloaded_line = "DIAG: slice unloaded"
        wait_until_sync(lambda: unloaded_line in moved[0].node_log()[marks[moved[0].name]:], 30.0, 0.2,
                        "the mover to free its old range")

        # and the survivors serve the model: llama.cpp's greedy text over the re-formed chain
        expected = llama_greedy(model, "the swarm organises itself", 12)

        async def serve():
            model_id = await wait_for_route(live[0], "auto8")
            status, _, text = await chat(live[0], model_id, "the swarm organises itself", max_tokens=12)
            assert status == 200, text
            assert text == expected
        run(serve())
    finally:
        for p in procs:
            p.terminate()


async def _min_is(proc: NodeProcess, want: int) -> bool:
    return await min_holders(proc) == want


def test_a_node_whose_budget_fits_no_layer_is_ready_once_the_swarm_covers_the_model(tmp_path):
    """It coordinated chains (200s) while /health/ready said 503 for ever: supervision waiting on
    readiness hung (a swarm test, 2026-12-06)."""
    model = write_gguf(tmp_path / "auto8.gguf", SynthSpec(**{**AUTO8.__dict__, "hidden": 256, "ffn": 512}))
    holder = start_auto_node(tmp_path, "holder", model, [], budget_mb=64)  # the whole model
    tiny = start_auto_node(tmp_path, "tiny", model, [holder.peer_port], budget_mb=1)  # a layer is ~2.6 MB
    try:
        async def check():
            await holder.async_wait_ready()
            await tiny.async_wait_ready()
            assert "reason=budget_fits_no_layer" in tiny.node_log()
            model_id = await wait_for_route(tiny, "auto8")
            status, _, text = await chat(tiny, model_id, "the swarm organises itself", max_tokens=6)
            assert status == 200 and text
        run(check())
    finally:
        for p in (holder, tiny):
            p.terminate()
