"""ServedModel: one whole model this node can run (its state, engine, placement, admission), and
the one rule for a model name's `:tag` (`untagged`). Kept by ModelManager (manager.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from node.inference.llama_engine import LlamaEngine
from node.inference.load_failure import LoadFailure
from node.inference.memory_estimate import MemoryEstimate
from node.inference.model_slots import ModelSlots
from node.inference.placement import Placement
from node.inference.tokenizer import ModelTokenizer
from node.models.catalog import ModelEntry

LATEST_TAG = ":latest"  # how Ollama lists a model (the Ollama dialect's /api/tags): the model itself


def untagged(name: str) -> str:
    """The one rule for a `:tag` after a model name, on every route of every dialect: `:latest`, how
    /api/tags lists a model (and what apps then send anywhere), is the model itself; any other tag
    is kept, so it names no model here (ids and names hold no `:`): `llama3:8b-q4` is another
    model, not this node's `llama3`, as on Ollama (a 404, not another file's replies). The tag is
    matched case-blind, as Ollama matches names (routes.go getExistingName: strings.EqualFold; review
    r52: `:LATEST` was a 404); the name before it is matched as it is (ids are what /api/tags lists)."""
    cut = len(name) - len(LATEST_TAG)
    return name[:cut] if cut > 0 and name[cut:].lower() == LATEST_TAG else name

States = ("unloaded", "loading", "loaded", "unloading", "failed")  # whole models; else "slices" or "swarm"


@dataclass
class ServedModel:
    """A whole model this node can run, and where it runs."""

    entry: ModelEntry
    whole: bool = True  # False: this node holds only slices of it (tokenizer here, layers in the swarm)
    tokenizer: ModelTokenizer | None = None
    engine: LlamaEngine | None = None
    state: str = "unloaded"
    device: str | None = None  # where its weights are (or go, while loading); None while none are
    cpu_placement_reason: str | None = None
    n_ctx: int = 0
    error: str | None = None
    waiting: int = 0
    busy: bool = False
    loaded_at: float | None = None
    last_used: float | None = None
    lock: ModelSlots = field(default_factory=lambda: ModelSlots(1))  # set to max_concurrent at registration
    load_task: asyncio.Task | None = None
    unloading: asyncio.Future | None = None  # set while an unload frees the weights (state "unloading")
    placement: Placement | None = None
    running: set = field(default_factory=set)  # GenerationJobs holding the model (force-unload cancels them)
    failure: LoadFailure | None = None  # its last load's failure (requests do not load it again)
    memory: MemoryEstimate | None = None  # what a load takes: weights + KV at n_ctx (set at registration)

    @property
    def id(self) -> str:
        return self.entry.id

    def summary(self) -> dict[str, Any]:
        """Admin API / GUI view: catalog metadata plus runtime state and placement."""
        return {
            **self.entry.summary(),
            "state": self.state,
            "device": self.device,
            "cpu_placement_reason": self.cpu_placement_reason,
            "n_ctx": self.n_ctx,
            "error": self.error,
            "failed_at": self.failure.at if self.failure is not None else None,
            # its vocabulary could not be read: every load is refused (ModelManager.unservable), so no Load
            "no_vocabulary": bool(self.failure is not None and self.failure.vocabulary),
            "busy": self.busy,
            "active": self.lock.holders,
            "max_concurrent": self.lock.limit,
            "waiting": self.waiting,
            "layers_held": [0, self.entry.n_layers],
            "engine": "llama.cpp",
            # a reranker (rank pooling) scores pairs on /v1/rerank; it is no chat model
            "reranker": bool(self.tokenizer is not None and self.tokenizer.reranker),
            # weights + KV cache once loaded, known before a load (the GUI's Memory column)
            "memory_estimate": self.memory.as_dict() if self.memory is not None else None,
        }
