"""Where a model runs: a GPU when one is present and the admission budget holds it, else the CPU
with the reason (seed 000). Engine-agnostic: estimated megabytes in, decision out, so the same
function places torch slices and whole models served by llama.cpp (`n_gpu_layers`).

The decision is greppable in the order it is taken:

    DIAG: admitting model to GPU model=X estimated_mb= committed_mb= budget_mb= headroom_mb=
    DIAG: GPU admission refused — not enough budget at this moment          (DEBUG)
    Model will run on the CPU model=X reason= configured_gpu_layers= estimated_vram_mb=

reason is one of not_enough_vram, configured_cpu_only, gpu_too_old_for_this_build, no_gpu and
gpu_not_supported_by_this_build (a GPU is there but this engine's build cannot use it).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from node.inference.devices import DeviceInventory, Gpu
from node.logs import kv

log = logging.getLogger(__name__)

GPU_RESERVE_MB = 512  # VRAM left free for the CUDA context, activations and other programs

NOT_ENOUGH_VRAM = "not_enough_vram"
CONFIGURED_CPU_ONLY = "configured_cpu_only"
GPU_TOO_OLD = "gpu_too_old_for_this_build"
NO_GPU = "no_gpu"
GPU_NOT_SUPPORTED = "gpu_not_supported_by_this_build"


@dataclass(frozen=True)
class Placement:
    """The decision for one model: what the admin API, the GUI and diagnostics show."""

    model: str
    device: str  # "cpu" or "cuda:<index>"
    cpu_placement_reason: str | None  # None when on a GPU
    estimated_mb: int
    n_gpu_layers: int = 0  # llama.cpp: -1 = every layer on the GPU, 0 = none
    gpu_index: int | None = None
    budget_mb: int | None = None
    headroom_mb: int | None = None  # budget left after this model (negative: did not fit)

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    def as_dict(self) -> dict:
        return asdict(self)


def place(model: str, estimated_mb: int, inventory: DeviceInventory, *, cpu_only: bool = False,
          committed_mb: dict[int, int] | None = None, budget_mb: int = 0, quiet: bool = False) -> Placement:
    """Decide where `model` (needing `estimated_mb` of weights + cache) runs.

    committed_mb: per GPU index, what this node already admitted there (models on the CPU do not
    count). budget_mb: the node's VRAM budget per GPU; 0 = free VRAM minus GPU_RESERVE_MB.
    quiet: a dry run (what a load would choose, for an estimate): the decision logs at DEBUG.
    """
    level = logging.DEBUG if quiet else logging.INFO
    if cpu_only:
        return _on_cpu(model, estimated_mb, CONFIGURED_CPU_ONLY, level)
    if not inventory.gpus:
        return _on_cpu(model, estimated_mb, NO_GPU, level)
    if not inventory.build_supports_gpu:
        return _on_cpu(model, estimated_mb, GPU_NOT_SUPPORTED, level)
    usable = [g for g in inventory.gpus if _new_enough(g, inventory.min_compute_capability)]
    if not usable:
        return _on_cpu(model, estimated_mb, GPU_TOO_OLD, level)
    committed_mb = committed_mb or {}
    best: tuple[int, Gpu, int, int] | None = None
    for gpu in usable:
        committed = committed_mb.get(gpu.index, 0)
        budget = budget_mb if budget_mb > 0 else gpu.free_mb + committed - GPU_RESERVE_MB
        room = min(budget - committed, gpu.free_mb - GPU_RESERVE_MB)
        headroom = room - estimated_mb
        if best is None or headroom > best[0]:
            best = (headroom, gpu, committed, budget)
    headroom, gpu, committed, budget = best
    log.log(level, "DIAG: admitting model to GPU %s", kv(model=model, gpu=gpu.index, estimated_mb=estimated_mb,
                                                   committed_mb=committed, budget_mb=budget, headroom_mb=headroom))
    if headroom >= 0:
        return Placement(model, f"cuda:{gpu.index}", None, estimated_mb, n_gpu_layers=-1, gpu_index=gpu.index,
                         budget_mb=budget, headroom_mb=headroom)
    log.debug("DIAG: GPU admission refused — not enough budget at this moment %s",
              kv(model=model, estimated_mb=estimated_mb, headroom_mb=headroom))
    return _on_cpu(model, estimated_mb, NOT_ENOUGH_VRAM, level, budget_mb=budget, headroom_mb=headroom)


def _new_enough(gpu: Gpu, minimum: tuple[int, int] | None) -> bool:
    return minimum is None or gpu.compute_capability >= minimum


def _on_cpu(model: str, estimated_mb: int, reason: str, level: int, **extra) -> Placement:
    log.log(level, "Model will run on the CPU %s", kv(model=model, reason=reason, configured_gpu_layers=0,
                                                estimated_vram_mb=estimated_mb))
    return Placement(model, "cpu", reason, estimated_mb, **extra)
