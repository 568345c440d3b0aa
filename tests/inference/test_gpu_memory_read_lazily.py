"""A registration does not read the GPUs' memory (2026-12-07): reading it (torch.cuda.mem_get_info)
makes a CUDA context on each GPU, hundreds of MB of VRAM held by a node that may never load a
model; every registration did, once per whole model. It counts the GPUs only (once); a load or
the Models tab's fit (async_estimate_load) reads them. The probes are injected: no CUDA here."""

from __future__ import annotations

import asyncio
import dataclasses

from node.config import NodeConfig
from node.inference.devices import DeviceInventory, Gpu
from node.inference.manager import ModelManager
from node.inference.synth import write_gguf
from node.models.catalog import ModelCatalog
from tests.support.nodes import TINY


class Probes:
    """The expensive probe (free memory: a CUDA context) and the cheap count, counted."""

    def __init__(self):
        self.read, self.counted = 0, 0

    def detect(self) -> DeviceInventory:
        self.read += 1
        return DeviceInventory(gpus=(Gpu(0, "Fake GPU", 24576, 16384, (8, 9)),), build_supports_gpu=True)

    def count(self) -> int:
        self.counted += 1
        return 1


def _manager(tmp_path, probes: Probes, **config) -> tuple[ModelManager, list]:
    catalog = ModelCatalog(tmp_path)
    specs = [dataclasses.replace(TINY, name=f"m{i}", vocab=TINY.vocab + i) for i in range(2)]  # two models
    entries = catalog.scan([(write_gguf(tmp_path / f"{spec.name}.gguf", spec), "cli") for spec in specs])
    models = ModelManager(NodeConfig(data_dir=tmp_path, **config), catalog)
    models.detect_devices = probes.detect
    models.sizing.count_gpus = probes.count
    return models, entries


def test_registration_counts_the_gpus_once_and_reads_them_only_when_asked(tmp_path):
    async def go():
        probes = Probes()
        models, entries = _manager(tmp_path, probes)
        try:
            for entry in entries:
                await models.async_register(entry)
            assert probes.read == 0, "a registration read the GPUs' memory (a CUDA context on each)"
            assert probes.counted == 1
            for entry in entries:  # GPUs there, unread: estimated as all in RAM until asked
                assert models.get(entry.id).memory.gpu_bytes == 0
            estimate = await models.async_estimate_load(entries[0].id)  # the Models tab selects it
            assert probes.read == 1 and estimate["gpu_bytes"] > 0
        finally:
            await models.async_close()

    asyncio.run(go())


def test_a_cpu_only_node_never_asks_about_gpus(tmp_path):
    async def go():
        probes = Probes()
        models, entries = _manager(tmp_path, probes, cpu_only=True)
        try:
            await models.async_register(entries[0])
            estimate = await models.async_estimate_load(entries[0].id)
            assert estimate["gpu_bytes"] == 0
            assert (probes.read, probes.counted) == (0, 0)
        finally:
            await models.async_close()

    asyncio.run(go())
