"""What the coordinator measured of its peers' serving, from the telemetry every RESULT carries.

Each hop appends `HopTelemetry` (wire.py) to the WORK as it travels; the last segment's RESULT
brings the whole list back. From it the coordinator keeps, per peer, an EWMA of ms per layer
(decode steps only: a prefill chunk's per-layer time says nothing about a token's), an EWMA of the
step's wall time and a sample count, and one EWMA of per-hop overhead. The planner prefers these
measured figures to a peer's advertised ms/layer (holders.py), the deadlines size a step's compute
allowance from them (deadlines.py), and diagnostics prints them (`-- peer serving performance --`).
The same telemetry adds up, per request, in the trace's segments (`segN_ms`, `activation_bytes`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from node.trace import RequestTrace

TELEMETRY_US = ("eval_us", "wait_us", "codec_us", "send_us")  # per-segment timings in RESULT telemetry


@dataclass
class PeerPerf:
    """What this coordinator measured of a peer's serving (diagnostics `peer serving performance`)."""

    samples: int = 0
    ms_per_layer: float | None = None
    ewma_step_ms: float | None = None
    measured_at: float | None = None  # wall clock of the last step (diagnostics: how old the figures are)

    def observe(self, eval_us: int, layers: int, n_tokens: int, step_ms: float) -> None:
        """One step this peer took part in: its compute for `layers`, the whole step's wall time."""
        self.samples += 1
        self.measured_at = time.time()
        if n_tokens == 1 and layers > 0:
            per_layer = eval_us / 1000.0 / layers
            self.ms_per_layer = per_layer if self.ms_per_layer is None else 0.8 * self.ms_per_layer + 0.2 * per_layer
        self.ewma_step_ms = step_ms if self.ewma_step_ms is None else 0.8 * self.ewma_step_ms + 0.2 * step_ms


class PeerPerformance:
    """Per-peer measurements and the per-hop overhead EWMA, fed one completed step at a time."""

    def __init__(self, node_id: str):
        self.node_id = node_id  # this node: its own hops are not a peer's performance
        self.peers: dict[str, PeerPerf] = {}
        self.hop_overhead_ms: float | None = None  # EWMA of (step wall - compute) / hops, decode steps

    def ms_per_layer(self, node_id: str) -> float | None:
        """This coordinator's measured decode ms/layer of a peer, None before its first decode step."""
        perf = self.peers.get(node_id)
        return perf.ms_per_layer if perf is not None else None

    def observe_whole(self, node_id: str, n_layers: int, eval_us: int, n_tokens: int, wall_ms: float) -> None:
        """A batch of decode tokens from a peer running the whole model (remote generate): its
        ms per token as ms/layer over n_layers, so the planner weighs it like a chain of slices."""
        perf = self.peers.setdefault(node_id, PeerPerf())
        per_token_us = eval_us / max(1, n_tokens)
        perf.observe(int(per_token_us), n_layers, 1, wall_ms / max(1, n_tokens))

    def observe_step(self, telemetry: Sequence[dict[str, Any]], n_tokens: int, wall_ms: float, hops: int,
                     route: Collection[str] = ()) -> None:
        """A completed step: each hop's telemetry, its token count, its wall time as the coordinator
        saw it, how many network hops it crossed (0 when every segment is this node), and the nodes
        of its route: telemetry naming any other node is not that node's performance (the list
        comes back from a peer; 2026-12-07 soak: each name it made up was kept for good)."""
        compute_ms = 0.0
        base_ms: float | None = None  # one thread hand-off and hand-back: a single process pays them too
        for tele in telemetry:
            eval_us, wait_us, _codec_us, send_us = (int(tele.get(k, 0)) for k in TELEMETRY_US)
            compute_ms += eval_us / 1000
            node = str(tele.get("node", ""))
            if base_ms is None or node == self.node_id:
                base_ms = (wait_us + send_us) / 1000
            if node and node != self.node_id and node in route:
                layers = int(tele.get("end", 0)) - int(tele.get("start", 0))
                self.peers.setdefault(node, PeerPerf()).observe(eval_us, layers, n_tokens, wall_ms)
        if n_tokens == 1 and hops:
            # everything but compute (codec, queueing, thread hand-offs, framing, TLS, the wire)
            # is hop cost, except the one hand-off/hand-back a single segment also pays
            overhead = max(0.0, wall_ms - compute_ms - (base_ms or 0.0)) / hops
            self.hop_overhead_ms = overhead if self.hop_overhead_ms is None else 0.9 * self.hop_overhead_ms + 0.1 * overhead


def add_segment_telemetry(trace: RequestTrace, telemetry: Sequence[dict[str, Any]]) -> None:
    """One step's telemetry into the request's segments: `segN_ms` = Σ eval + wait + codec + send,
    `activation_bytes` = bytes each segment sent on, and the four timings summed per segment."""
    by_start = {seg.layer_start: seg for seg in trace.segments}
    for tele in telemetry:
        seg = by_start.get(int(tele.get("start", -1)))
        if seg is None:
            continue
        timings = {key: int(tele.get(key, 0)) for key in TELEMETRY_US}
        seg.elapsed_ms += sum(timings.values()) / 1000
        seg.activation_bytes += int(tele.get("bytes_out", 0))
        for key, us in timings.items():
            seg.telemetry[key] = seg.telemetry.get(key, 0) + us


class LocalSpeeds:
    """This machine's decode ms/layer on each model, per device. A new slice starts from it (a
    slice of the model on the same device beside it, else the last one unloaded there): unmeasured,
    it cost the planner's default 2 ms/layer and lost its own layers to a measured peer, so it was
    never used, so never measured (a swarm test, 2026-12-06)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, float]] = {}  # sha256 -> (device, ms/layer)

    def remember(self, hosted: Any) -> None:
        """A slice going away leaves its figure (a HostedSlice: entry, placement, ms_per_layer)."""
        if hosted.ms_per_layer is not None and hosted.placement is not None:
            self._last[hosted.entry.sha256] = (str(hosted.placement.device), hosted.ms_per_layer)

    def start_from(self, siblings: Sequence[Any], sha256: str, device: str) -> float | None:
        """The figure a new slice of `sha256` on `device` starts from (None: never measured here)."""
        for s in siblings:
            if s.ms_per_layer and s.placement is not None and str(s.placement.device) == device:
                return s.ms_per_layer
        last = self._last.get(sha256)
        return last[1] if last is not None and last[0] == device else None
