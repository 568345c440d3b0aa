"""Route planning: a chain of segments covering layers [0, L) with the least estimated time per token.

Pure functions over `Holder` records, so planning is unit-tested without a network. A segment is a
holder's whole advertised range; ranges must abut (layer `b` of one segment is the first layer of
the next). Estimated time per token = Σ ms/layer × layers + Σ hop latency, where entering a remote
segment costs half its round-trip time from the coordinator, and so does the way back from the
last one. Ties prefer local segments, then fewer hops. A standby for a segment is another holder of
exactly the same range, the fastest one not already in the chain. A node holding the model whole
(llama.cpp, `whole`) is a holder of [0, L) that samples itself: a chain of one segment, weighed like
any other by its ms/layer (its ms per token / L).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from node.errors import InsufficientCapacity

log = logging.getLogger(__name__)

DEFAULT_MS_PER_LAYER = 2.0  # until a holder has been measured


@dataclass(frozen=True)
class Holder:
    """A node that can run layers [start, end) of a model right now."""

    node_id: str
    start: int
    end: int
    transport: str = "direct"  # local | direct | relayed
    rtt_ms: float = 0.0
    ms_per_layer: float | None = None
    region: str | None = None
    whole: bool = False  # llama.cpp holds the whole model: usable only as one segment [0, n_layers)

    @property
    def layers(self) -> int:
        return self.end - self.start

    @property
    def short_id(self) -> str:
        return self.node_id[:8]

    def compute_ms(self) -> float:
        return (self.ms_per_layer if self.ms_per_layer is not None else DEFAULT_MS_PER_LAYER) * self.layers

    def hop_ms(self) -> float:
        return 0.0 if self.transport == "local" else self.rtt_ms / 2.0


@dataclass
class Plan:
    """The chosen chain, its standbys (same index; None when there is none) and its estimate."""

    segments: list[Holder]
    standbys: list[Holder | None] = field(default_factory=list)
    est_ms: float = 0.0

    def describe(self) -> str:
        return ",".join(f"{h.short_id}[{h.start}-{h.end - 1}]" for h in self.segments)


def plan_route(n_layers: int, holders: list[Holder], *, exclude: frozenset[str] = frozenset()) -> Plan:
    """Cheapest chain covering [0, n_layers) from holders not in `exclude` (InsufficientCapacity if none)."""
    usable = [h for h in holders if h.node_id not in exclude and 0 <= h.start < h.end <= n_layers
              and (not h.whole or (h.start, h.end) == (0, n_layers))]  # a whole holder: one segment, never cut
    # best[b] = (cost, local_layers_negated, hops, chain) of the cheapest chain covering [0, b)
    best: dict[int, tuple[float, int, int, list[Holder]]] = {0: (0.0, 0, 0, [])}
    for boundary in sorted({0} | {h.start for h in usable}):
        if boundary not in best:
            continue
        cost, neg_local, hops, chain = best[boundary]
        used = {h.node_id for h in chain}
        for h in usable:
            if h.start != boundary or h.node_id in used:
                continue
            cand = (cost + h.compute_ms() + h.hop_ms(), neg_local - (h.layers if h.transport == "local" else 0),
                    hops + 1, [*chain, h])
            if h.end not in best or cand[:3] < best[h.end][:3]:
                best[h.end] = cand
    if n_layers not in best:
        covered = sorted((h.start, h.end) for h in usable)
        raise InsufficientCapacity(
            f"no chain of peers covers all {n_layers} layers of this model right now "
            f"(holders cover {covered or 'nothing'})")
    cost, _, _, chain = best[n_layers]
    if chain[-1].transport != "local":
        cost += chain[-1].hop_ms()
    in_chain = {h.node_id for h in chain}
    standbys: list[Holder | None] = []
    for seg in chain:
        spares = [h for h in usable if (h.start, h.end) == (seg.start, seg.end) and h.node_id not in in_chain]
        spares.sort(key=lambda h: (h.compute_ms() + h.hop_ms(), h.node_id))
        standbys.append(spares[0] if spares else None)
    return Plan(chain, standbys, cost)
