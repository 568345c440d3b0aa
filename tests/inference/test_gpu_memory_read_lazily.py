"""A registration does not read the GPUs' memory (2026-12-07): reading it (torch.cuda.mem_get_info)
makes a CUDA context on each GPU, hundreds of MB of VRAM held by a node that may never load a
model; every registration did, once per whole model. It counts the GPUs only (once); a load or
the Models tab's fit (async_estimate_load) reads them. The probes are injected: no CUDA here.

2026-12-07 (review): a started node still read every GPU's free memory, the machine snapshot's
(sysinfo.gpu_inventory, at each start, a CPU-only node's too). It reads the device's properties
only (name, total memory: no context), and a CPU-only node asks CUDA nothing. torch.cuda's
functions are replaced by fakes that count the calls."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from node.config import NodeConfig
from node.inference.devices import DeviceInventory, Gpu
from node.inference.manager import ModelManager
from node.inference.synth import write_gguf
from node.models.catalog import ModelCatalog
from tests.support.nodes import TINY, node_config, running_node


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


class FakeCuda:
    """torch.cuda with one 24 GiB GPU: which functions were called, how often."""

    def __init__(self, monkeypatch, driver: bool = True):
        self.calls: dict[str, int] = {}
        monkeypatch.setattr("node.sysinfo.gpu_driver_present", lambda: driver)  # (this machine has none)
        props = SimpleNamespace(name="Fake GPU", total_memory=24 * 2**30, major=8, minor=9)
        for name, result in (("is_available", True), ("device_count", 1), ("get_device_properties", props),
                             ("mem_get_info", (16 * 2**30, 24 * 2**30))):
            monkeypatch.setattr(torch.cuda, name, self._counted(name, result))

    def _counted(self, name: str, result):
        def call(*_args, **_kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return result
        return call


@pytest.mark.parametrize("cpu_only", [False, True])
async def test_a_started_node_does_not_read_the_gpus_memory(tmp_path, monkeypatch, cpu_only):
    cuda = FakeCuda(monkeypatch)
    async with running_node(node_config(tmp_path / "data", cpu_only=cpu_only)) as node:
        machine = await node.async_machine()
        report = await node.async_report()
    assert "mem_get_info" not in cuda.calls, "the start made a CUDA context to read a GPU's free memory"
    if cpu_only:
        assert machine.gpus == [] and cuda.calls == {}, "a CPU-only node asked CUDA"
    else:
        assert [(g.name, g.total_mb, g.free_mb) for g in machine.gpus] == [("Fake GPU", 24576, None)]
        assert "gpu0: Fake GPU (sm 8.9) vram 24576 MiB, free not read (no load yet)" in report


def test_no_gpu_driver_asks_torch_nothing(monkeypatch):
    """No GPU driver on the machine (2026-12-07): the snapshot and llama.cpp's count ask torch
    nothing, so a node serving through llama.cpp never imports it for them."""
    from node.inference.devices import count_llama_gpus, detect_llama
    from node.sysinfo import gpu_inventory

    cuda = FakeCuda(monkeypatch, driver=False)
    assert gpu_inventory() == [] and count_llama_gpus() == 0 and detect_llama().gpus == ()
    assert cuda.calls == {}
