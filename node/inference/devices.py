"""Device inventory for placement: which GPUs exist and what this build can run on them.

A plain, frozen description so `placement.place` stays a pure function that tests can feed
fakes. `detect_torch()` reads it from torch (the slice engine); `detect_llama()` from torch's
GPU list plus llama.cpp's own GPU support (whole models served by llama.cpp); `count_llama_gpus()`
only counts them, without the CUDA context reading a GPU's free memory makes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from node import sysinfo
from node.torch_import import import_torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    """One CUDA device."""

    index: int
    name: str
    total_mb: int
    free_mb: int
    compute_capability: tuple[int, int]


@dataclass(frozen=True)
class DeviceInventory:
    """GPUs seen, whether the engine's build can use a GPU at all, and the oldest it supports."""

    gpus: tuple[Gpu, ...] = ()
    build_supports_gpu: bool = False
    min_compute_capability: tuple[int, int] | None = None  # None: no known lower bound


def _torch_gpus() -> tuple[tuple[Gpu, ...], tuple[int, int] | None]:
    if not sysinfo.gpu_driver_present():  # no GPU driver: torch would find none (and is not imported for it)
        return (), None
    try:
        torch = import_torch()
        if not torch.cuda.is_available():
            return (), None
        gpus = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            gpus.append(Gpu(i, props.name, total // 2**20, free // 2**20, (props.major, props.minor)))
        archs = [a for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
        caps = sorted((int(a[3:-1]), int(a[-1])) for a in archs if a[3:].isdigit())
        return tuple(gpus), (caps[0] if caps else None)
    except Exception as exc:  # a broken driver reads as "no GPU", with the reason logged
        log.warning("GPU inventory failed: %s", exc)
        return (), None


def detect_torch() -> DeviceInventory:
    """What torch (the slice engine) can use. Blocking: call from an executor."""
    gpus, min_cc = _torch_gpus()
    return DeviceInventory(gpus=gpus, build_supports_gpu=bool(gpus), min_compute_capability=min_cc)


def _llama_offload() -> bool:
    """Whether this llama.cpp build can offload to a GPU (no llama.cpp or a broken one: no)."""
    try:
        from node.inference.llamacpp import load

        return bool(load().llama_supports_gpu_offload())
    except Exception:  # no llama.cpp or a broken one: no GPU path either
        return False


def detect_llama() -> DeviceInventory:
    """What llama.cpp can use: the GPUs torch sees, if llama.cpp was built with GPU offload.
    Reads each GPU's free memory (torch.cuda.mem_get_info), which makes a CUDA context on it
    (hundreds of MB of VRAM held by this process from then on)."""
    gpus, _ = _torch_gpus()
    return DeviceInventory(gpus=gpus, build_supports_gpu=_llama_offload())


def count_llama_gpus() -> int:
    """How many GPUs llama.cpp could use, without reading them: torch.cuda.is_available() and
    device_count() only (no CUDA context is made); 0 when its build has no GPU offload (torch is
    then not imported) or no GPU driver is here. Blocking."""
    if not sysinfo.gpu_driver_present() or not _llama_offload():
        return 0
    try:
        torch = import_torch()
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken driver reads as "no GPU", with the reason logged
        log.warning("GPU count failed: %s", exc)
        count = 0
    return count
