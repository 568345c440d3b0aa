"""The Swarm tab's data: per model, who holds which layers (a layer map), where the gaps are, and
the last request's chain over it; plus the throughput series of the live plot.

Built from what the node already publishes: its own adverts and its peers' HELLO adverts (the
swarm coverage the layer choice and diagnostics read), peer events, slice host events and trace
events. `NodeFeeds` calls `refresh()` on those events; nothing here polls the node.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.ui import fmt
from app.ui.table_model import Column, KeyedTableModel
from node.inference.pipeline import layerchoice as lc
from node.inference.pipeline.coverage import swarm_coverage


@dataclass
class Holder:
    """One row of the layer map: a node's range of one model."""

    node_id: str
    start: int
    end: int  # exclusive
    n_layers: int
    ms_per_layer: float | None = None
    whole: bool = False  # serves the model whole (llama.cpp), not a slice
    loading: bool = False  # claimed, its layers arriving (not routed to yet)
    fetch: tuple[int, int] | None = None  # (bytes here, bytes wanted) when this node fetches it
    this_node: bool = False
    hop: int | None = None  # its place in the last request's chain (0-based), None when not on it
    hop_layers: tuple[int, int] | None = None  # the layers that hop ran here [a, b) (a holder may run part)
    hop_ms: float | None = None
    standby: bool = False  # a chain is drawn and this holder is not on it
    transport: str | None = None  # the last chain's hop: local | direct | relayed
    address: str = fmt.DASH  # redacted as the Peers tab shows it

    @property
    def role(self) -> str:
        if self.loading:
            done, total = self.fetch or (0, 0)
            return f"fetching layers {done * 100 // total}%" if total else "loading"
        if self.hop is not None:
            ran = self.hop_layers or (self.start, self.end)
            part = "" if ran == (self.start, self.end) else f" (ran {fmt.layers(list(ran))})"
            return f"hop {self.hop + 1} of the last request{part}"
        if self.whole:
            return "whole model (llama.cpp)"
        return "standby" if self.standby else "serving"


@dataclass
class ModelMap:
    """One model's layer map."""

    sha256: str
    name: str
    model_id: str
    n_layers: int
    holders: list[Holder] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # holders per layer (slices; whole holders separate)
    chain_at: float | None = None  # when the drawn chain's request finished (wall clock)
    chain_ms: float | None = None  # that request's total time
    chain_hops: int = 0  # that request's hops, drawn or not (a holder gone since has no row to draw on)

    @property
    def gaps(self) -> list[tuple[int, int]]:
        """Runs of layers no slice covers, inclusive [(a, b)]."""
        runs: list[tuple[int, int]] = []
        for layer, count in enumerate(self.counts):
            if count:
                continue
            if runs and runs[-1][1] == layer - 1:
                runs[-1] = (runs[-1][0], layer)
            else:
                runs.append((layer, layer))
        return runs

    def coverage_text(self) -> str:
        if not self.holders:
            return "nobody serves it"
        if any(h.whole for h in self.holders) and not any(not h.whole for h in self.holders):
            return "served whole only"
        gaps = self.gaps
        if not gaps:  # whole holders hold every layer too (the map counts them)
            low = (min(self.counts) if self.counts else 0) + sum(1 for h in self.holders if h.whole)
            return f"every layer covered (at least {low} holder{'s' if low != 1 else ''})"
        runs = ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in gaps)
        if any(h.whole for h in self.holders):  # served anyway: only the slices leave layers out
            return f"served whole; slices leave out layers {runs}"
        return "gap: layers " + runs

    def chain_text(self) -> str:
        """The line under the drawn chain: 'last request: 2 hops, 143 ms in all, 12:04:05'. Its hops are
        the request's, not the rows drawn: a hop on a node gone since is said, not dropped (it read
        "1 hop" under a hop numbered 2 once the peer of hop 1 had left)."""
        if not self.chain_hops:
            return ""
        drawn = sum(1 for h in self.holders if h.hop is not None)
        text = f"last request: {self.chain_hops} hop{'s' if self.chain_hops != 1 else ''}"
        if drawn < self.chain_hops:
            gone = self.chain_hops - drawn
            text += f" ({gone} on {'a node' if gone == 1 else 'nodes'} no longer serving it, not drawn)"
        if self.chain_ms is not None:
            text += f", {fmt.ms(self.chain_ms)} in all"
        if self.chain_at:
            text += f", {fmt.clock(self.chain_at)}"
        return text


def _chain_of(trace: Any) -> list[Any]:
    return [s for s in getattr(trace, "segments", None) or [] if s.layer_end > s.layer_start]


def build_maps(node_id: str, adverts: Iterable[Mapping[str, Any]], peers: Iterable[Any],
               ids: Mapping[str, str], last_traces: Mapping[str, Any], fetches: Mapping[tuple[str, int, int],
                                                                                        tuple[int, int]],
               address_of: Callable[[str], str]) -> list[ModelMap]:
    """The maps of every model the swarm or this node serves. `ids`: sha256 -> model id here;
    `last_traces`: model id -> its last finished request that ran on a chain."""
    peers = list(peers)
    loading = {(p.node_id, m.get("sha256"), m.get("start"), m.get("end"))
               for p in peers if p.state == "connected" for m in p.models if isinstance(m, Mapping) and m.get("loading")}
    loading |= {(node_id, m.get("sha256"), m.get("start"), m.get("end")) for m in adverts if m.get("loading")}
    maps = []
    for sha, cov in sorted(swarm_coverage(node_id, adverts, peers).items(), key=lambda kv: kv[1].name):
        model_id = ids.get(sha) or f"{cov.name}-{sha[:8]}"
        mm = ModelMap(sha, cov.name, model_id, cov.n_layers)
        served = [s for s in cov.spans if (s.node_id, sha, s.start, s.end) not in loading]
        mm.counts = [int(c) for c in lc.layer_counts(cov.n_layers, served)]
        for s in cov.spans:
            mm.holders.append(Holder(s.node_id, s.start, s.end, cov.n_layers, s.ms_per_layer,
                                     loading=(s.node_id, sha, s.start, s.end) in loading,
                                     fetch=fetches.get((sha, s.start, s.end)) if s.node_id == node_id else None,
                                     this_node=s.node_id == node_id,
                                     address="this machine" if s.node_id == node_id else address_of(s.node_id)))
        for holder in cov.whole:
            mm.holders.append(Holder(holder, 0, cov.n_layers, cov.n_layers, whole=True, this_node=holder == node_id,
                                     address="this machine" if holder == node_id else address_of(holder)))
        trace = last_traces.get(model_id)
        if trace is not None:
            chain = _chain_of(trace)
            mm.chain_at, mm.chain_ms, mm.chain_hops = trace.created_at, trace.total_ms, len(chain)
            for hop, seg in enumerate(chain):
                h = next((h for h in mm.holders if h.node_id[:8] == seg.node_short_id[:8] and not h.whole
                          and h.start <= seg.layer_start and seg.layer_end <= h.end and h.hop is None), None)
                if h is not None:
                    h.hop, h.hop_ms, h.transport = hop, seg.elapsed_ms, seg.transport
                    h.hop_layers = (seg.layer_start, seg.layer_end)
            for h in mm.holders:
                h.standby = h.hop is None and not h.whole and not h.loading
        mm.holders.sort(key=lambda h: (h.whole, h.start, h.end, h.node_id))
        maps.append(mm)
    return maps


def _ms_text(h: Holder) -> str:
    return fmt.ms(h.ms_per_layer) if h.ms_per_layer is not None else fmt.DASH


class LayerMapModel(KeyedTableModel):
    """The selected model's holders, one row each (the painted map draws the same rows)."""

    def __init__(self, parent=None):
        columns = [
            Column("Node", lambda h: h.node_id[:8] + (" (this node)" if h.this_node else ""),
                   tooltip=lambda h: h.node_id, header_tip="the node holding these layers (its id's first 8 digits)"),
            Column("Address", lambda h: h.address, header_tip="redacted as in the Peers tab (“Show addresses” there)"),
            Column("Layers", lambda h: fmt.layers([h.start, h.end], h.n_layers),
                   header_tip="the transformer blocks it serves, inclusive"),
            Column("ms/layer", _ms_text, numeric=True,
                   header_tip="measured compute time per layer for one token, as the node advertises it"),
            Column("Role", lambda h: h.role,
                   header_tip="hop N: on the last request's chain; standby: not on it, could take over its "
                              "layers; fetching: claimed, its layers arriving"),
            Column("Hop time", lambda h: fmt.ms(h.hop_ms), numeric=True,
                   header_tip="time the last request spent on this hop (compute and transfer)"),
            Column("Link", lambda h: h.transport or fmt.DASH,
                   header_tip="how the last request reached it: local, direct TLS, or relayed"),
        ]
        super().__init__(columns, parent=parent)
        self.maps: list[ModelMap] = []
        self.selected: str | None = None  # sha256

    def set_maps(self, maps: list[ModelMap]) -> None:
        if maps == self.maps:  # a peer's ping (or another event that changed nothing drawn): no redraw
            return
        self.maps = maps
        if self.selected not in {m.sha256 for m in maps}:
            self.selected = maps[0].sha256 if maps else None
        self._show()

    def select(self, sha256: str | None) -> None:
        self.selected = sha256
        self._show()

    def current(self) -> ModelMap | None:
        return next((m for m in self.maps if m.sha256 == self.selected), None)

    def _show(self) -> None:
        current = self.current()
        rows = [((h.node_id, h.start, h.end, h.whole), h) for h in (current.holders if current else [])]
        if [k for k, _ in rows] == self.keys():
            for key, h in rows:  # same rows: values in place, one dataChanged each (selection kept)
                self._values[key] = h
                self.refresh(key)
        else:
            self.replace_all(rows)


class RateSeries:
    """Tokens/s and requests/min over the last `window_s`, in `bucket_s` buckets, from finished traces."""

    def __init__(self, window_s: float = 300.0, bucket_s: float = 10.0, clock: Callable[[], float] = time.time):
        self.window_s, self.bucket_s, self.clock = window_s, bucket_s, clock
        self._tokens: collections.Counter[int] = collections.Counter()
        self._requests: collections.Counter[int] = collections.Counter()

    def add(self, finished_at: float, tokens: int) -> None:
        b = int(finished_at // self.bucket_s)
        self._tokens[b] += tokens
        self._requests[b] += 1
        oldest = int((self.clock() - self.window_s) // self.bucket_s)
        for counter in (self._tokens, self._requests):
            for key in [k for k in counter if k < oldest]:
                del counter[key]

    def series(self) -> tuple[list[float], list[float]]:
        """(tokens per second, requests per minute) per bucket, oldest first, the current one last."""
        now = int(self.clock() // self.bucket_s)
        n = int(self.window_s // self.bucket_s)
        keys = range(now - n + 1, now + 1)
        return ([self._tokens[k] / self.bucket_s for k in keys],
                [self._requests[k] * 60.0 / self.bucket_s for k in keys])
