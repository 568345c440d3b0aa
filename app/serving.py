"""What a node can serve right now, read from its model manager, slice host and pipeline.

Read when an event says something changed (model or peer observers), never on a timer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.node import Node


def _local_clock(unix_time: float) -> str:
    """The app says a time in the user's own (the Swarm tab's "choosing again at" too); node.log and
    the report say it in UTC marked Z (review r74: the tray said one, the Swarm tab the other)."""
    return time.strftime("%H:%M:%S", time.localtime(unix_time))


@dataclass(frozen=True)
class Serving:
    """A snapshot of what a node can serve (read when an event says something changed)."""

    whole_loaded: tuple[str, ...] = ()  # model ids loaded whole (llama.cpp, local route)
    slices_loaded: tuple[str, ...] = ()  # "name[a-b]" layer slices held for the swarm
    swarm: tuple[str, ...] = ()  # model names the swarm covers layer by layer (distributed route)
    loading: bool = False
    failed: bool = False
    idle: bool = False  # some model is registered but unloaded (the user can Load it)
    whole_idle: tuple[str, ...] = ()  # whole models unloaded that a request loads again (on demand)
    choice_failed: tuple[str, ...] = ()  # the layer choice's last failed loads, in words (AutoServe.failures)

    def describe(self) -> str:
        parts = list(self.whole_loaded)
        parts += [f"{m} (unloaded: loads on the first request)" for m in self.whole_idle]
        if self.slices_loaded:
            parts.append("layers " + ", ".join(self.slices_loaded))
        local_names = {w.rsplit("-", 1)[0] for w in self.whole_loaded}
        swarm = [n for n in self.swarm if n not in local_names]
        if swarm:
            parts.append("via peers " + ", ".join(swarm))
        return "; ".join(parts) or "nothing"

    def brief(self) -> str:
        """describe() in counts, for one short line (the status bar): "2 models (+1 loads on the first
        request) · layers of 1 model · 3 via peers"; a single model keeps its name."""
        local_names = {w.rsplit("-", 1)[0] for w in self.whole_loaded}
        swarm = [n for n in self.swarm if n not in local_names]
        parts = []
        whole = len(self.whole_loaded) + len(self.whole_idle)
        if whole == 1 and not self.slices_loaded and not swarm:
            return self.describe()
        if self.whole_loaded:
            parts.append(_count(len(self.whole_loaded), "model"))
        if self.whole_idle:
            idle = f"{len(self.whole_idle)} unloaded: loads on the first request"
            parts.append(f"+{idle}" if self.whole_loaded else idle)
        if self.slices_loaded:
            parts.append(_count(len(self.slices_loaded), "layer slice"))
        if swarm:
            parts.append(f"{len(swarm)} via peers")
        return " · ".join(parts) or "nothing"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def serving_of(node: Node) -> Serving:
    """Read what the node can serve from its model manager, slice host and pipeline."""
    whole = node.models.whole_models()
    slices = list(node.slice_host.slices.values())
    swarm = node.pipeline.swarm_models() if node.pipeline is not None else {}
    # a slice loading again after a failed load counts as failed until it loads: the app showed
    # "loading" (banner hidden) between two failures of each background retry (2026-12-07)
    retries = [s for s in slices if s.state == "loading" and s.retrying is not None]
    again, retried = {s.entry.id for s in retries}, {id(s) for s in retries}
    failures = node.autoserve.failures() if node.autoserve is not None else []
    return Serving(
        whole_loaded=tuple(m.id for m in whole if m.state == "loaded"),
        slices_loaded=tuple(f"{s.entry.name}[{s.start}-{s.end - 1}]" for s in slices if s.state == "loaded"),
        swarm=tuple(sorted(str(info.get("name") or sha[:12]) for sha, info in swarm.items())),
        loading=any(x.state == "loading" for x in [*whole, *slices] if id(x) not in retried),
        failed=any(x.state == "failed" for x in [*whole, *slices]) or bool(retries),
        idle=any(m.state == "unloaded" for m in whole),
        whole_idle=tuple(m.id for m in whole if m.state == "unloaded" and m.tokenizer is not None),
        choice_failed=tuple(f.text(retrying=f.model in again, clock=_local_clock) for f in failures),
    )
