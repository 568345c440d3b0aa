"""A slice this node hosts (HostedSlice: its model, executor, state and stats) and `--layers`
parsing; the host that loads and serves them is host.py (split from it 2026-12-07)."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

from node.errors import ModelLoadError
from node.inference.pipeline.batching import StepQueue
from node.inference.placement import Placement
from node.models.catalog import ModelEntry


def parse_layers(text: str, n_layers: int) -> tuple[int, int]:
    """`--layers A-B` (inclusive, as in ds4: 0-11 is twelve layers) → [A, B+1)."""
    try:
        first, last = (int(p) for p in text.split("-", 1))
    except ValueError as exc:
        raise ModelLoadError(f"--layers must look like A-B (inclusive), got {text!r}") from exc
    if first > last:
        raise ModelLoadError(f"--layers {text}: the first layer comes first (--layers {last}-{first})")
    if not 0 <= first <= last < n_layers:
        raise ModelLoadError(f"--layers {text} is outside the model's layers 0-{n_layers - 1}")
    return first, last + 1


@dataclass
class ServedStats:
    """What a slice did for coordinators other than this node (diagnostics `served for others`)."""

    sessions: int = 0  # sessions started here for other coordinators
    steps: int = 0
    tokens: int = 0
    eval_ms: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    coordinators: dict[str, float] = field(default_factory=dict)  # short id -> last seen (bounded below)


@dataclass
class HostedSlice:
    """A loaded slice and the executor it runs on."""

    entry: ModelEntry
    start: int
    end: int
    model: Any = None  # node.inference.slice.SliceModel once loaded
    executor: concurrent.futures.ThreadPoolExecutor | None = None
    state: str = "loading"  # loading | loaded | draining (moved away: finishes its sessions) | failed
    error: str | None = None
    served: ServedStats = field(default_factory=ServedStats)
    ms_per_layer: float | None = None  # EWMA of decode steps measured here
    advertised_ms: float | None = None  # the ms/layer peers last heard (HELLO)
    placement: Placement | None = None
    auto_budget: tuple[int, int] | None = None  # --serve auto: (layers, with head) this node's budget fits
    step_queue: StepQueue = field(default_factory=StepQueue)
    vocab: Any = None  # ModelTokenizer of the slice's GGUF, read on the first constrained step (last segment)
    fetch: tuple[int, int] | None = None  # a partial model's layers arriving: (bytes here, bytes wanted)
    retrying: str | None = None  # loading again after a failed load: that load's error (the app keeps it shown)
    refused_changed: bool = False  # failed because its file holds other bytes (FileChangedOnDisk)
    # drained because its file changed on disk (or its parts proved altered: SliceHost._parts_dropped):
    # never revived by a load of its range, even once a re-hash finds the old bytes back (its open
    # file's stat is not the one it opened: review r34)
    drained_changed: bool = False
    # its file's new stat being hashed (a step found it changed): not advertised nor given new sessions
    checking: bool = False
    touched: bool = False  # failed: its file was touched at every load it tried (the same bytes): tried later

    def vocabulary(self):
        """The model's vocabulary from the slice's own GGUF (blocking: on the slice's executor, the
        one thread that samples): what a grammar or a logit_bias is checked and compiled against."""
        if self.vocab is None:
            from node.inference.tokenizer import ModelTokenizer

            self.vocab = ModelTokenizer(self.entry.tokenizer_path)
        return self.vocab

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.entry.sha256, self.start, self.end)

    @property
    def is_last(self) -> bool:
        return self.end == self.entry.n_layers

    def note_eval(self, eval_us: int, n_tokens: int, layers: int | None = None) -> None:
        """Fold one decode step's compute time over `layers` (default: all loaded; a sub-range ran
        fewer) into ms/layer (prefill steps would skew it)."""
        if n_tokens != 1:
            return
        per_layer = eval_us / 1000.0 / (layers or (self.end - self.start))
        self.ms_per_layer = per_layer if self.ms_per_layer is None else 0.8 * self.ms_per_layer + 0.2 * per_layer

    def advert(self) -> dict[str, Any]:
        """This slice as peers see it in HELLO."""
        return {"sha256": self.entry.sha256, "name": self.entry.name, "arch": self.entry.architecture,
                "start": self.start, "end": self.end, "n_layers": self.entry.n_layers,
                "ms_per_layer": round(self.ms_per_layer, 3) if self.ms_per_layer is not None else None,
                **({"auto_budget": list(self.auto_budget)} if self.auto_budget is not None else {})}

    def summary(self) -> dict[str, Any]:
        """Admin API / GUI row."""
        info = self.model.info if self.model is not None else None
        in_use, kept = self.model.sessions.counts() if self.model is not None else (0, 0)
        return {
            "id": self.entry.id, "name": self.entry.name, "sha256": self.entry.sha256,
            "layers_held": [self.start, self.end], "n_layers": self.entry.n_layers, "state": self.state,
            "engine": "torch-slice", "dtype": info.fmt if info else None,
            "device": info.device if info else "cpu", "error": self.error,
            "cpu_placement_reason": self.placement.cpu_placement_reason if self.placement else None,
            "sessions": in_use, "kept_sessions": kept,
            "kv_mb": round(self.model.sessions.total_bytes() / 2**20, 1) if self.model is not None else 0.0,
            "load_ms": self.model.load_ms if self.model is not None else None,
            "weight_cache": self.model.weight_cache if self.model is not None else None,
            "kernel": self.model.kernel if self.model is not None else None,
            "kv_dtype": self.model.kv_name if self.model is not None else None,
            "partial": self.entry.partial.describe() if self.entry.partial is not None else None,
            "fetch": {"done_bytes": self.fetch[0], "total_bytes": self.fetch[1]} if self.fetch is not None else None,
            # its touched file being hashed again: not advertised nor given new sessions (review r40: not shown)
            "checking": self.checking,
            # only while it loads: a slice that loaded said "retrying" an old error for ever (2026-12-07)
            "retrying": self.retrying if self.state == "loading" else None,
        }
