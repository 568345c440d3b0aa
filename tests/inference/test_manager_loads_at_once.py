"""Two whole models loaded at once are placed as one after the other would be (2026-12-07). Each load
placed its model off the loop, against the GPU's free memory and what the loaded models had taken:
a load under way counted nowhere, so two loads asked for together (two clients' first requests,
two "Load" clicks) both went to a GPU that holds one, and the second failed in llama.cpp for want
of VRAM (or a configured budget was overrun). The GPU is a fake whose free memory is what the
models loaded on it leave (no CUDA here); the loads are real llama.cpp loads of tiny models."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from node.config import NodeConfig
from node.inference.devices import DeviceInventory, Gpu
from node.inference.llama_engine import LlamaEngine
from node.inference.manager import ModelManager
from node.inference.placement import GPU_RESERVE_MB, NOT_ENOUGH_VRAM
from node.inference.synth import write_gguf
from node.models.catalog import ModelCatalog
from tests.support.nodes import TINY
from tests.support.waiting import wait_until

ROOM_FOR_ONE_MB = 300  # a tiny model's estimate is ~257 MB: one fits, two do not


async def _two_models(tmp_path, **config) -> tuple[ModelManager, list[str]]:
    catalog = ModelCatalog(tmp_path)
    specs = [dataclasses.replace(TINY, name=f"m{i}", vocab=TINY.vocab + i) for i in range(2)]
    entries = catalog.scan([(write_gguf(tmp_path / f"{spec.name}.gguf", spec), "cli") for spec in specs])
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1, **config), catalog)

    def gpu() -> DeviceInventory:  # what the models loaded on it hold is not free
        held = sum(m.placement.estimated_mb for m in models.all()
                   if m.engine is not None and m.placement is not None and m.placement.gpu_index == 0)
        free = GPU_RESERVE_MB + ROOM_FOR_ONE_MB - held
        return DeviceInventory(gpus=(Gpu(0, "Fake GPU", 24576, free, (8, 9)),), build_supports_gpu=True)

    models.detect_devices = gpu
    models.sizing.count_gpus = lambda: 1
    for entry in entries:
        await models.async_register(entry)
    return models, [e.id for e in entries]


@pytest.mark.parametrize("config", [{}, {"gpu_memory_budget_mb": ROOM_FOR_ONE_MB}], ids=["free_vram", "budget"])
async def test_two_loads_at_once_do_not_both_take_a_gpu_that_holds_one(tmp_path, config):
    models, ids = await _two_models(tmp_path, **config)
    try:
        await asyncio.gather(*(models.async_load(model_id) for model_id in ids))
        placed = {model_id: models.get(model_id).placement for model_id in ids}
        on_gpu = [model_id for model_id, p in placed.items() if p.gpu_index == 0]
        assert len(on_gpu) == 1, f"both loads took the GPU that holds one: {placed}"
        [other] = [p for p in placed.values() if p.gpu_index is None]
        assert other.cpu_placement_reason == NOT_ENOUGH_VRAM
    finally:
        await models.async_close()


async def test_one_after_the_other_the_second_goes_to_the_cpu(tmp_path):
    """The same two loads in turn (what the fake GPU above models): the second is refused the GPU."""
    models, ids = await _two_models(tmp_path)
    try:
        for model_id in ids:
            await models.async_load(model_id)
        assert [models.get(i).placement.gpu_index for i in ids] == [0, None]
    finally:
        await models.async_close()


async def test_a_load_under_way_on_the_gpu_is_counted_once(tmp_path, monkeypatch):
    """Review r60: the first load's weights already on the GPU (its free memory says so) were counted
    again as a load under way, and a second model that fits beside it went to the CPU. Now a load
    placed on a GPU holds the placement's turn until it is loaded: the second sees the GPU as it is."""
    models, ids = await _two_models(tmp_path)  # (fake GPU: room for one; raised to two below)
    on_gpu: set[str] = set()  # whose weights llama.cpp has put on the GPU (before its load ends)
    release = threading.Event()
    real_load = LlamaEngine.load

    def load_on_gpu(self):
        real_load(self)
        if self.n_gpu_layers:
            on_gpu.add(self.model_id)
        assert release.wait(30)  # the rest of a big model's load: its VRAM taken already

    def gpu() -> DeviceInventory:
        held = sum(m.placement.estimated_mb for m in models.all() if m.id in on_gpu and m.placement is not None)
        return DeviceInventory(gpus=(Gpu(0, "Fake GPU", 24576, GPU_RESERVE_MB + 2 * ROOM_FOR_ONE_MB - held, (8, 9)),),
                               build_supports_gpu=True)

    monkeypatch.setattr(LlamaEngine, "load", load_on_gpu)
    models.detect_devices = gpu
    a, b = ids
    try:
        first = asyncio.create_task(models.async_load(a))
        await wait_until(lambda: a in on_gpu, 30, what="the first model's weights on the GPU")
        second = asyncio.create_task(models.async_load(b))
        await wait_until(lambda: models.get(b).state == "loading", 30, what="the second load to begin")
        release.set()
        await asyncio.gather(first, second)
        placed = {i: models.get(i).placement for i in ids}
        assert [p.gpu_index for p in placed.values()] == [0, 0], f"one that fits went to the CPU: {placed}"
    finally:
        release.set()
        await models.async_close()
