"""torch and the slice engine, imported once, off the event loop, when the node first needs them.

A node that serves whole models through llama.cpp, or only uses the swarm, never imports torch:
before 2026-12-07 every start did (node.node → ... → pipeline.batching → `import torch`: 1.5 s of
a 2.1 s import, RSS 63 → 241 MB). What needs the engine — loading a slice, the slice sizes a layer
choice reads, the GPU probe — runs in an executor and imports it there; a coroutine that is about
to touch the engine's modules awaits `async_ensure_torch()` first, so that its own imports of them
are lookups (`import torch` on the loop holds it for 1.5 s).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import time

from node.logs import kv
from node.torch_import import freeze_once, import_torch

log = logging.getLogger(__name__)

# what the slice engine imports at its top level: loaded together, in one executor call
ENGINE_MODULES = ("torch", "node.inference.slice", "node.inference.slice.model", "node.inference.pipeline.sampler",
                  "node.inference.weights.gguf_file")


def torch_loaded() -> bool:
    """Whether this process has imported torch (a lookup: never imports it)."""
    return "torch" in sys.modules


def load_engine() -> None:
    """Import torch and the slice engine (blocking: seconds the first time; run it in an executor),
    their long-lived objects then out of the collector's full passes (torch_import.freeze_once)."""
    import_torch()
    for name in ENGINE_MODULES:
        importlib.import_module(name)
    freeze_once("slice engine")


async def async_ensure_torch() -> None:
    """torch and the slice engine imported, in the default executor the first time."""
    if all(name in sys.modules for name in ENGINE_MODULES):
        return
    started = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, load_engine)
    log.info("DIAG: slice engine loaded %s", kv(elapsed_ms=int((time.monotonic() - started) * 1000)))
