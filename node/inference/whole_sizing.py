"""Where llama.cpp would run a whole model and what memory its load takes: the placement (through
the devices llama.cpp can use), the KV sequences it holds, the estimate before a load (the Models
tab's Memory column and fit). ModelManager owns one `WholeSizing`; the rest is pure.

Reading a GPU's free memory (`detect_llama`: torch.cuda.mem_get_info) makes a CUDA context on it,
hundreds of MB of VRAM this process then holds. A load reads it, and so does the Models tab's fit
(`ModelManager.async_estimate_load`); a registration's dry run only counts the GPUs (once: no
context) and, while no load or fit has read them, estimates a model a GPU would take as all in RAM.
A node configured CPU-only never asks (2026-12-07: every registration read every GPU, so a node
that never loaded a model held a CUDA context on each). Nor does the node's start: its machine
snapshot (sysinfo.gpu_inventory) reads each GPU's name and total memory from its properties (no
context) and not at all on a CPU-only node (2026-12-07 review: it read every GPU's free memory at
every start, which is where the contexts still came from).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from node.config import NodeConfig
from node.inference.devices import DeviceInventory, count_llama_gpus, detect_llama
from node.inference.memory_estimate import MemoryEstimate, estimate_whole
from node.inference.placement import Placement, place
from node.models.catalog import ModelEntry


def place_whole_model(entry: ModelEntry, config: NodeConfig, committed_mb: dict[int, int],
                      detect: Callable[[], DeviceInventory] = detect_llama, quiet: bool = False) -> Placement:
    """Where llama.cpp runs a whole model (blocking: detects devices; run it in an executor);
    `quiet`: a dry run for an estimate, logged at DEBUG."""
    estimated_mb = entry.size_bytes // 2**20 + 256  # weights + KV cache and compute buffers, roughly
    inventory = DeviceInventory() if config.cpu_only else detect()  # (CPU-only: no GPU is asked about)
    return place(entry.id, estimated_mb, inventory, cpu_only=config.cpu_only, committed_mb=committed_mb,
                 budget_mb=config.gpu_memory_budget_mb, quiet=quiet)


def kv_sequences(n_ctx: int, max_concurrent: int, kv_cache_seqs: int,
                 kv_total_tokens: int) -> tuple[int, int, bool]:
    """(sequences decoding at once, cached sequences, spare) of one whole model: each holds n_ctx
    tokens of KV, and all of them at most kv_total_tokens, so a long context does not multiply the
    KV memory by the sequence count (8 x 8192 tokens of an 8B model would be 8 GB); the cache gives
    way first, and one sequence always remains. Requests beyond it wait in the batch engine's queue.
    With several at once the batch engine wants one sequence more that stays empty (its spare: then
    moving the running ones onto consecutive ids never evicts a cached one); it comes before the
    cache, and when the running ones fill the budget there is none (a move may then evict)."""
    room = max(1, kv_total_tokens // max(1, n_ctx))
    concurrent = max(1, min(max_concurrent, room))
    spare = concurrent > 1 and room > concurrent
    return concurrent, max(0, min(kv_cache_seqs, room - concurrent - spare)), spare


class WholeSizing:
    """The placement and memory of this node's whole models, under its config."""

    def __init__(self, config: NodeConfig):
        self.config = config
        # the GPUs llama.cpp can use (blocking; tests put a fake GPU here, never CUDA)
        self.detect_devices: Callable[[], DeviceInventory] = detect_llama
        self.count_gpus: Callable[[], int] = count_llama_gpus  # (cheap: no CUDA context; tests inject both)
        self._gpus: int | None = None  # count_gpus(), asked once
        self._memory_read = False  # detect_devices ran: the contexts are made, a dry run may read too

    def sequences(self, n_ctx: int) -> tuple[int, int, bool]:
        """kv_sequences() of a whole model served at `n_ctx` on this node."""
        return kv_sequences(n_ctx, self.config.max_concurrent, self.config.kv_cache_seqs, self.config.kv_total_tokens)

    def estimate(self, entry: ModelEntry, n_ctx: int, n_gpu_layers: int = 0) -> MemoryEstimate:
        """What a load of `entry` at `n_ctx` takes (weights + KV), the part on a GPU with `n_gpu_layers`."""
        tokens = n_ctx * sum(self.sequences(n_ctx))
        return estimate_whole(entry.header, entry.size_bytes, tokens, n_gpu_layers)

    async def async_place(self, entry: ModelEntry, committed_mb: dict[int, int], *, dry: bool = False,
                          read_memory: bool = True) -> Placement | None:
        """Where a load of `entry` goes now (devices detected off the loop); `dry`: for an estimate
        (no log at INFO, nothing placed). Without `read_memory` (a registration) the GPUs' memory is
        not read unless it was already: None when GPUs are there (where it goes is not known yet)."""
        return await asyncio.get_running_loop().run_in_executor(None, self._place, entry, committed_mb, dry,
                                                                read_memory)

    def _place(self, entry: ModelEntry, committed_mb: dict[int, int], dry: bool, read_memory: bool) -> Placement | None:
        if not (read_memory or self._memory_read or self.config.cpu_only):
            if self._gpus is None:
                self._gpus = self.count_gpus()
            if self._gpus:
                return None
            return place_whole_model(entry, self.config, committed_mb, DeviceInventory, dry)  # no GPU: the CPU
        if not self.config.cpu_only:
            self._memory_read = True
        return place_whole_model(entry, self.config, committed_mb, self.detect_devices, dry)
