"""Placement decisions over fake device inventories, and their DIAG lines (seed 000)."""

from __future__ import annotations

import logging

import pytest
import torch

from node.inference.devices import DeviceInventory, Gpu, detect_torch
from node.inference.placement import place

A100 = Gpu(0, "A100", total_mb=40960, free_mb=40000, compute_capability=(8, 0))
K80 = Gpu(1, "K80", total_mb=12288, free_mb=12000, compute_capability=(3, 7))
SMALL = Gpu(0, "MX150", total_mb=2048, free_mb=1800, compute_capability=(6, 1))
BUILD = {"build_supports_gpu": True, "min_compute_capability": (5, 0)}


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_fits_on_the_gpu(caplog):
    with caplog.at_level(logging.DEBUG, logger="node.inference.placement"):
        p = place("m", 1300, DeviceInventory((A100,), **BUILD))
    assert (p.device, p.cpu_placement_reason, p.n_gpu_layers, p.on_gpu) == ("cuda:0", None, -1, True)
    line = next(line for line in _lines(caplog) if line.startswith("DIAG: admitting model to GPU"))
    for field in ("model=m", "estimated_mb=1300", "committed_mb=0", "budget_mb=", "headroom_mb="):
        assert field in line


def test_not_enough_vram_logs_refusal_then_cpu(caplog):
    with caplog.at_level(logging.DEBUG, logger="node.inference.placement"):
        p = place("big", 4000, DeviceInventory((SMALL,), **BUILD))
    assert (p.device, p.cpu_placement_reason, p.n_gpu_layers) == ("cpu", "not_enough_vram", 0)
    assert p.headroom_mb < 0
    lines = _lines(caplog)
    order = [i for i, line in enumerate(lines) for key in ("admitting model to GPU", "admission refused",
                                                           "Model will run on the CPU") if key in line]
    assert order == sorted(order)
    assert len(order) == 3
    assert "reason=not_enough_vram" in lines[-1]


def test_committed_vram_and_budget_count():
    inv = DeviceInventory((A100,), **BUILD)
    assert place("m", 1000, inv, budget_mb=1500, committed_mb={0: 600}).cpu_placement_reason == "not_enough_vram"
    assert place("m", 1000, inv, budget_mb=1500, committed_mb={0: 400}).device == "cuda:0"


@pytest.mark.parametrize(("inventory", "cpu_only", "reason"), [
    (DeviceInventory((A100,), **BUILD), True, "configured_cpu_only"),
    (DeviceInventory((), **BUILD), False, "no_gpu"),
    (DeviceInventory((K80,), **BUILD), False, "gpu_too_old_for_this_build"),
    (DeviceInventory((A100,), build_supports_gpu=False), False, "gpu_not_supported_by_this_build"),
])
def test_cpu_reasons(caplog, inventory, cpu_only, reason):
    with caplog.at_level(logging.INFO, logger="node.inference.placement"):
        p = place("m", 100, inventory, cpu_only=cpu_only)
    assert (p.device, p.cpu_placement_reason) == ("cpu", reason)
    assert p.as_dict()["cpu_placement_reason"] == reason
    assert f"Model will run on the CPU model=m reason={reason} configured_gpu_layers=0" in _lines(caplog)[-1]
    assert not any("admitting model to GPU" in line for line in _lines(caplog))


def test_picks_the_gpu_with_room_and_skips_old_ones():
    roomy = Gpu(2, "L4", total_mb=24576, free_mb=24000, compute_capability=(8, 9))
    p = place("m", 5000, DeviceInventory((K80, SMALL, roomy), **BUILD))
    assert p.device == "cuda:2"


def test_detect_on_this_machine_agrees_with_torch():
    inv = detect_torch()
    expected = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    assert [g.name for g in inv.gpus] == expected
    assert inv.build_supports_gpu is bool(expected)
    if not expected:  # and placement then says why the CPU: no GPU, not an old or unsupported one
        assert place("m", 100, inv).cpu_placement_reason == "no_gpu"


class _Props:
    def __init__(self, name: str, major: int, minor: int):
        self.name, self.major, self.minor = name, major, minor


def _fake_cuda(monkeypatch, props: list[_Props], free_total: list[tuple[int, int]], archs: list[str]):
    monkeypatch.setattr("node.sysinfo.gpu_driver_present", lambda: True)  # (no driver here: torch not asked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: free_total[i])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: archs)


def test_detect_reads_devices_memory_and_the_oldest_supported_arch(monkeypatch):
    mib = 2**20
    _fake_cuda(monkeypatch, [_Props("A100", 8, 0), _Props("K80", 3, 7)],
               [(40000 * mib, 40960 * mib), (12000 * mib + 5, 12288 * mib)],
               ["sm_86", "sm_50", "compute_90", "sm_90"])
    inv = detect_torch()
    assert inv.gpus == (Gpu(0, "A100", total_mb=40960, free_mb=40000, compute_capability=(8, 0)),
                        Gpu(1, "K80", total_mb=12288, free_mb=12000, compute_capability=(3, 7)))
    assert inv.build_supports_gpu is True
    assert inv.min_compute_capability == (5, 0)  # the oldest sm_ the build has kernels for
    assert place("m", 1300, inv).device == "cuda:0"
    assert place("m", 100, DeviceInventory(inv.gpus[1:], True, inv.min_compute_capability)).cpu_placement_reason \
        == "gpu_too_old_for_this_build"


def test_a_broken_driver_reads_as_no_gpu_with_the_reason_logged(monkeypatch, caplog):
    def broken(i):
        raise RuntimeError("CUDA driver version is insufficient")

    _fake_cuda(monkeypatch, [_Props("A100", 8, 0)], [(1, 1)], ["sm_80"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    with caplog.at_level(logging.WARNING, logger="node.inference.devices"):
        inv = detect_torch()
    assert inv == DeviceInventory()
    assert "GPU inventory failed: CUDA driver version is insufficient" in caplog.text
    assert place("m", 100, inv).cpu_placement_reason == "no_gpu"
