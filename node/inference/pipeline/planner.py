"""Route planning: a chain of segments covering layers [0, L) with the least estimated time per token.

Pure functions over `Holder` records, so planning is unit-tested and simulated without a network.
A segment is any sub-range of what a holder has loaded (a holder of 0-15 can run 8-15 of a chain);
ranges may overlap. Estimated time per token = Σ ms/layer × layers + Σ hop latency, where entering a
remote segment costs half its round-trip time from the coordinator, and so does the way back from
the last one. Ties prefer more layers run locally, then fewer hops. A node appears at most once in
a chain (one KV session per request and node). A whole-model holder (llama.cpp) is never cut: it is
only ever a chain of one segment [0, L).

The search is a sweep over the candidate cuts (0, L and the holders' starts and ends: moving the
switch between two holders anywhere else changes the cost linearly, so an end point is never
worse; plus L-1 when a local holder reaches the end, because ending locally saves a remote last
segment's way back whatever the local tail's length). Each holder keeps the best way to have entered it so far, so a cut costs one update per
holder covering it. The node-once rule is enforced by constraint generation: when the best chain
passes a node twice, that node's use becomes part of the sweep's state and it runs again (exact;
planning over 1,000 holders of an 80-layer model takes ~7 ms CPU with standbys, bench/planner_bench.py). Remote
holders of one range that KEEP_DOMINATED others of that range beat on both ms/layer and latency
are pruned first. A standby for a segment is the cheapest holder or chain of holders, none of them
in the chain, that covers the segment's layers.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np

from node.errors import InsufficientCapacity
from node.logs import kv

log = logging.getLogger(__name__)

DEFAULT_MS_PER_LAYER = 2.0  # until a holder has been measured
MAX_CONFLICT_NODES = 8  # nodes the node-once rule tracks in a chain's state (2^N states per cut)
NUMPY_MIN_HOLDERS = 200  # from here on a sweep is vectorised (below, numpy's per-call overhead loses)
KEEP_DOMINATED = 3  # same-range holders kept although others are no slower and no farther
MAX_MS = 60_000.0  # a ms/layer or RTT figure is clamped to this (a minute): keys stay exact int64


def sane_ms(value: object, default: float | None) -> float | None:
    """A time figure a peer advertised, as the planner may use it: a finite real number, > 0 and at
    most MAX_MS; anything else (NaN, ±Infinity — JSON as Python parses it —, ≤ 0, a string, a bool)
    is `default`. A negative figure would attract every route, an infinite one crash the search."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return default
    return min(float(value), MAX_MS)


@dataclass(frozen=True)
class Holder:
    """A node that can run any sub-range of layers [start, end) of a model right now (a segment of
    a plan is a Holder whose start/end are the sub-range it runs)."""

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

    def layer_ms(self) -> float:
        return sane_ms(self.ms_per_layer, DEFAULT_MS_PER_LAYER)

    def compute_ms(self) -> float:
        return self.layer_ms() * self.layers

    def hop_ms(self) -> float:
        return 0.0 if self.transport == "local" else sane_ms(self.rtt_ms, 0.0) / 2.0

    def contains(self, start: int, end: int) -> bool:
        return self.start <= start < end <= self.end


def describe_chain(chain: list[Holder], sep: str = ",") -> str:
    """`aaaaaaaa[0-3],bbbbbbbb[4-7]` (inclusive layer numbers, as `--layers`)."""
    return sep.join(f"{h.short_id}[{h.start}-{h.end - 1}]" for h in chain)


@dataclass
class Plan:
    """The chosen chain, per segment a standby chain (same index; None when there is none) and the estimate."""

    segments: list[Holder]
    standbys: list[list[Holder] | None] = field(default_factory=list)
    est_ms: float = 0.0

    def describe(self) -> str:
        return describe_chain(self.segments)

    def describe_standbys(self) -> str:
        """Per segment its standby chain (`+` between its holders) or `-`, comma-separated."""
        return ",".join(describe_chain(s, "+") if s else "-" for s in self.standbys)


def layer_coverage(n_layers: int, holders: list[Holder]) -> list[tuple[int, int, list[Holder]]]:
    """Maximal runs [start, end) of layers held by the same set of holders (each run's list in the
    input order), in order, covering [0, n_layers): a run with an empty list is a gap. One
    definition for diagnostics and layer choice."""
    valid = [(i, h) for i, h in enumerate(holders) if 0 <= h.start < h.end <= n_layers]
    cuts = sorted({0, n_layers} | {h.start for _, h in valid} | {h.end for _, h in valid})
    opens: dict[int, list[int]] = {}
    closes: dict[int, list[int]] = {}
    for i, h in valid:
        opens.setdefault(h.start, []).append(i)
        closes.setdefault(h.end, []).append(i)
    active: set[int] = set()
    runs: list[tuple[int, int, list[Holder]]] = []
    last: list[int] | None = None
    for a, b in zip(cuts, cuts[1:], strict=False):
        active.difference_update(closes.get(a, ()))
        active.update(opens.get(a, ()))
        held = sorted(active)
        if held == last:
            runs[-1] = (runs[-1][0], b, runs[-1][2])
        else:
            runs.append((a, b, [holders[i] for i in held]))
            last = held
    return runs


def _gaps(n_layers: int, holders: list[Holder]) -> list[tuple[int, int]]:
    """Layer ranges [a, b) no holder covers (sorted sweep, no per-run sets)."""
    gaps, reach = [], 0
    for h in sorted(holders, key=lambda h: h.start):
        if h.start > reach:
            gaps.append((reach, h.start))
        reach = max(reach, h.end)
    if reach < n_layers:
        gaps.append((reach, n_layers))
    return gaps


def _prune(holders: list[Holder]) -> list[Holder]:
    """Drop remote holders of one range that KEEP_DOMINATED others of that range beat or tie on
    both ms/layer and hop latency (they could only matter to a chain that used all of those)."""
    groups: dict[tuple[int, int, bool], list[Holder]] = {}
    kept: list[Holder] = []
    for h in holders:
        if h.transport == "local":
            kept.append(h)
        else:
            groups.setdefault((h.start, h.end, h.whole), []).append(h)
    for group in groups.values():
        if len(group) <= KEEP_DOMINATED:
            kept += group
            continue
        group.sort(key=lambda h: (h.layer_ms(), h.hop_ms(), h.node_id))
        hops: list[float] = []  # hop latencies of the group's faster holders, sorted
        for h in group:
            if bisect.bisect_right(hops, h.hop_ms()) < KEEP_DOMINATED:
                kept.append(h)
            bisect.insort(hops, h.hop_ms())
    return kept


# Chains are compared by one integer: cost in µs, then fewer local layers loses, then more hops
# loses, packed as cost << 20 | (LOCAL_MAX - local layers) << 8 | hops. Every part adds up along a
# chain, so a segment adds its parts' sum and integers compare exactly (no float ties).
_COST, _LOCAL, LOCAL_MAX = 20, 8, 2047
# A label is one chain reaching a cut: (key, mask, parent, holder, a, b); `mask` has a bit per
# conflict node the chain uses (see _cheapest)
_Label = tuple


def _us(ms: float) -> int:
    return int(round(ms * 1000))


def _cheapest(lo: int, hi: int, n_layers: int, holders: list[Holder]) -> _Label | None:
    """The best label covering [lo, hi) with sub-ranges of (non-whole) holders, or None.

    A node at most once: the sweep runs unconstrained first; when its chain passes some node
    twice, that node becomes a conflict node, tracked as a bit of each chain's state, and the
    sweep runs again (constraint generation: exact, and the common case costs one sweep)."""
    conflict: dict[str, int] = {}
    while True:
        if conflict:
            best = _sweep(lo, hi, n_layers, holders, conflict)
        elif len(holders) >= NUMPY_MIN_HOLDERS:
            best = _sweep_plain(lo, hi, n_layers, holders)
        else:
            best = _sweep_small(lo, hi, n_layers, holders)
        if best is None:
            return None
        nodes = [h.node_id for h in _unwind(best)]
        repeated = {n for n in nodes if nodes.count(n) > 1}
        if not repeated:
            return best
        if len(conflict) + len(repeated) > MAX_CONFLICT_NODES:
            log.info("DIAG: route planning gave up on the node-once rule %s", kv(conflict_nodes=len(conflict)))
            return None
        for node in sorted(repeated):
            conflict[node] = 1 << len(conflict)


def _tail_cut(lo: int, hi: int, n_layers: int, holders: list[Holder]) -> set[int]:
    """The cut before the last layer, when a local holder could run it: ending the chain locally
    saves the remote last segment's way back, whatever the local tail's length, so the cheapest
    switch to it may be one layer before the end (not only at a holder's start or end)."""
    if hi != n_layers or hi - 1 <= lo:
        return set()
    return {hi - 1} if any(h.transport == "local" and not h.whole and h.start < hi - 1 and h.end == hi
                           for h in holders) else set()


def _sweep(lo: int, hi: int, n_layers: int, holders: list[Holder], conflict: dict[str, int]) -> _Label | None:
    """One sweep over the cuts in [lo, hi]: per cut the best chain reaching it for each set of
    conflict nodes used; per holder the best way to have entered it so far (a segment's key is
    linear in the cut it leaves at, so one entry per conflict set is enough)."""
    cuts = sorted({lo, hi} | {h.start for h in holders if lo < h.start < hi} | {h.end for h in holders if lo < h.end < hi}
                  | _tail_cut(lo, hi, n_layers, holders))
    index = {b: i for i, b in enumerate(cuts)}
    opening: list[list[list]] = [[] for _ in cuts]  # per cut, the holders whose clipped range starts there
    for h in holders:
        a, b = max(h.start, lo), min(h.end, hi)
        if a < b and not h.whole:
            local = h.transport == "local"
            hop = _us(h.hop_ms()) << _COST
            # per layer: ms/layer in the cost part, one local layer less in the locality part
            slope = (_us(h.layer_ms()) << _COST) - ((1 << _LOCAL) if local else 0)
            # [holder, slope, key added on entry, added when last (the way back), conflict bit,
            #  closing cut, entries: mask -> (key - slope × entry cut, label, entry cut)]
            opening[index[a]].append([h, slope, hop + 1, hop, conflict.get(h.node_id, 0), index[b], {}])
    here: dict[int, _Label] = {0: ((LOCAL_MAX << _LOCAL), 0, None, None, lo, lo)}
    active: list[list] = []
    last = len(cuts) - 1
    for j, q in enumerate(cuts):
        if j:
            reached: dict[int, _Label] = {}
            still = []
            for rec in active:
                h, slope, enter, back, bit, close, ent = rec
                add = slope * q + enter + (back if q == n_layers else 0)
                for mask, (t, lab, p) in ent.items():
                    key, m2 = t + add, mask | bit
                    cur = reached.get(m2)
                    if cur is None or key < cur[0]:
                        reached[m2] = (key, m2, lab, h, p, q)
                if close > j:
                    still.append(rec)
            active = still
            here = reached
        if j == last:
            break
        active += opening[j]
        if not here:
            continue
        items = list(here.items())
        for rec in active:
            slope, bit, ent = rec[1], rec[4], rec[6]
            off = slope * q
            for mask, lab in items:
                if mask & bit:
                    continue  # this chain already passes through the holder's (conflict) node
                t = lab[0] - off
                old = ent.get(mask)
                if old is None or t < old[0]:
                    ent[mask] = (t, lab, q)
    return min(here.values(), key=lambda lab: lab[0]) if here else None


def _sweep_plain(lo: int, hi: int, n_layers: int, holders: list[Holder]) -> _Label | None:
    """`_sweep` without conflict nodes (one chain per cut, one entry per holder): the common case,
    vectorised over the holders (numpy int64 keys) because a swarm simulation plans over a
    thousand holders many times."""
    sel = [h for h in holders if not h.whole and max(h.start, lo) < min(h.end, hi)]
    cuts = sorted({lo, hi} | {h.start for h in sel if lo < h.start} | {h.end for h in sel if h.end < hi}
                  | _tail_cut(lo, hi, n_layers, sel))
    index = {b: i for i, b in enumerate(cuts)}
    first = np.array([index[max(h.start, lo)] for h in sel], dtype=np.int64)
    close = np.array([index[min(h.end, hi)] for h in sel], dtype=np.int64)
    hop = np.array([_us(h.hop_ms()) << _COST for h in sel], dtype=np.int64)
    slope = np.array([(_us(h.layer_ms()) << _COST) - ((1 << _LOCAL) if h.transport == "local" else 0)
                      for h in sel], dtype=np.int64)
    unset = np.iinfo(np.int64).max
    entry = np.full(len(sel), unset, dtype=np.int64)  # best key - slope × cut of entering each holder
    entered_at = np.zeros(len(sel), dtype=np.int64)
    # per cut: the best chain reaching it as (key, holder number, cut its last segment entered at)
    best: list[tuple[int, int, int] | None] = [None] * len(cuts)
    best[0] = (LOCAL_MAX << _LOCAL, -1, 0)
    for j, q in enumerate(cuts):
        if j:
            live = np.flatnonzero((entry != unset) & (close >= j))
            if live.size:
                keys = entry[live] + slope[live] * q + hop[live] + 1
                if q == n_layers:
                    keys += hop[live]  # the RESULT's way back from the last segment
                k = int(keys.argmin())
                n = int(live[k])
                best[j] = (int(keys[k]), n, int(entered_at[n]))
        if j == len(cuts) - 1 or best[j] is None:
            continue
        offered = best[j][0] - slope * q
        better = (first <= j) & (close > j) & (offered < entry)
        entry = np.where(better, offered, entry)
        entered_at = np.where(better, j, entered_at)
    if best[-1] is None:
        return None
    # rebuild the chain as labels, root first
    steps, j = [], len(cuts) - 1
    while j:
        key, n, p = best[j]
        steps.append((key, n, p, j))
        j = p
    label: _Label = (LOCAL_MAX << _LOCAL, 0, None, None, lo, lo)
    for key, n, p, j in reversed(steps):
        label = (key, 0, label, sel[n], cuts[p], cuts[j])
    return label


def _sweep_small(lo: int, hi: int, n_layers: int, holders: list[Holder]) -> _Label | None:
    """`_sweep_plain` in plain Python: faster than numpy's per-call overhead for a few holders."""
    cuts = sorted({lo, hi} | {h.start for h in holders if lo < h.start < hi} | {h.end for h in holders if lo < h.end < hi}
                  | _tail_cut(lo, hi, n_layers, holders))
    index = {b: i for i, b in enumerate(cuts)}
    opening: list[list[list]] = [[] for _ in cuts]
    for h in holders:
        a, b = max(h.start, lo), min(h.end, hi)
        if a < b and not h.whole:
            hop = _us(h.hop_ms()) << _COST
            slope = (_us(h.layer_ms()) << _COST) - ((1 << _LOCAL) if h.transport == "local" else 0)
            # [holder, slope, key added on entry, the way back, closing cut, entry key - slope × cut, label, cut]
            opening[index[a]].append([h, slope, hop + 1, hop, index[b], None, None, 0])
    here: _Label | None = ((LOCAL_MAX << _LOCAL), 0, None, None, lo, lo)
    active: list[list] = []
    last = len(cuts) - 1
    for j, q in enumerate(cuts):
        if j:
            best_key, best = None, None
            back = q == n_layers
            for rec in active:
                t = rec[5]
                if t is not None:
                    key = t + rec[1] * q + rec[2] + (rec[3] if back else 0)
                    if best_key is None or key < best_key:
                        best_key, best = key, rec
            here = None if best is None else (best_key, 0, best[6], best[0], best[7], q)
        if j == last:
            break
        active = [rec for rec in active if rec[4] > j] + opening[j]
        if here is None:
            continue
        lab_key = here[0]
        for rec in active:
            t = lab_key - rec[1] * q
            if rec[5] is None or t < rec[5]:
                rec[5], rec[6], rec[7] = t, here, q
    return here


def _unwind(label: _Label) -> list[Holder]:
    chain = []
    while label[3] is not None:
        chain.append(replace(label[3], start=label[4], end=label[5]))
        label = label[2]
    return chain[::-1]


def _whole_label(n_layers: int, holders: list[Holder], lo: int, hi: int) -> _Label | None:
    """The best whole-model holder as a one-segment chain, when [lo, hi) is the whole model."""
    if (lo, hi) != (0, n_layers):
        return None
    root: _Label = ((LOCAL_MAX << _LOCAL), 0, None, None, 0, 0)
    best = None
    for h in holders:
        if h.whole and (h.start, h.end) == (0, n_layers):
            local = n_layers if h.transport == "local" else 0
            # the same arithmetic as a sliced chain's (µs per layer × layers), so the two compare exactly
            key = ((_us(h.layer_ms()) * n_layers + 2 * _us(h.hop_ms())) << _COST) + ((LOCAL_MAX - local) << _LOCAL) + 1
            if best is None or key < best[0]:
                best = (key, 0, root, h, 0, n_layers)
    return best


def _best(lo: int, hi: int, n_layers: int, holders: list[Holder]) -> _Label | None:
    sliced = _cheapest(lo, hi, n_layers, holders)
    whole = _whole_label(n_layers, holders, lo, hi)
    if whole is None or (sliced is not None and sliced[0] <= whole[0]):
        return sliced
    return whole


def estimate_ms(chain: list[Holder], n_layers: int) -> float:
    """A chain's estimated ms per token: compute, hop into each segment, the way back from the last."""
    if not chain:
        return 0.0
    last = chain[-1]
    return sum(h.compute_ms() + h.hop_ms() for h in chain) + (last.hop_ms() if last.end == n_layers else 0.0)


def plan_route(n_layers: int, holders: list[Holder], *, exclude: frozenset[str] = frozenset(),
               standbys: bool = True) -> Plan:
    """Cheapest chain covering [0, n_layers) from holders not in `exclude`, with a standby chain per
    segment unless `standbys` is False (then Plan.standbys is []: a coverage check or a simulation
    that only needs the chain skips more than half the work); InsufficientCapacity naming the
    uncovered layers if there is no chain."""
    usable = _prune([h for h in holders if h.node_id not in exclude and 0 <= h.start < h.end <= n_layers
                     and (not h.whole or (h.start, h.end) == (0, n_layers))])
    best = _best(0, n_layers, n_layers, usable)
    if best is None:
        gaps = _gaps(n_layers, usable)
        why = ("no holder has layers " + ", ".join(f"{a}-{b - 1}" for a, b in gaps)) if gaps else \
            "the holders would have to pass a node twice"
        raise InsufficientCapacity(
            f"no chain of peers covers all {n_layers} layers of this model right now ({why}; held: "
            f"{', '.join(f'{a}-{b - 1}' for a, b in sorted({(h.start, h.end) for h in usable})) or 'nothing'})")
    return _with_standbys(_unwind(best), usable, n_layers, standbys)


def _with_standbys(chain: list[Holder], usable: list[Holder], n_layers: int, standbys: bool) -> Plan:
    in_chain = {h.node_id for h in chain}
    spare = [h for h in usable if h.node_id not in in_chain] if standbys else []
    spares: list[list[Holder] | None] = []
    for seg in chain if standbys else ():
        near = [h for h in spare if h.start < seg.end and seg.start < h.end]
        found = _best(seg.start, seg.end, n_layers, near)
        spares.append(_unwind(found) if found is not None else None)
    return Plan(chain, spares, estimate_ms(chain, n_layers))


def plan_kept_route(n_layers: int, holders: list[Holder], route: tuple[tuple[str, int, int], ...], *,
                    exclude: frozenset[str] = frozenset()) -> Plan | None:
    """The plan that runs exactly `route` ((node, start, end) per hop: a kept session's chain, whose
    KV a conversation's next turn reuses), with standbys as plan_route gives them, when every hop's
    node still holds its layers and is not excluded; None otherwise."""
    candidates = [h for h in holders if h.node_id not in exclude and 0 <= h.start < h.end <= n_layers
                  and (not h.whole or (h.start, h.end) == (0, n_layers))]
    if not route or route[0][1] != 0 or route[-1][2] != n_layers \
            or any(a[2] != b[1] for a, b in zip(route, route[1:], strict=False)):
        return None
    chain = []
    for node_id, start, end in route:
        # (among all holders: _prune drops a same-range holder when others are as fast, which
        # is the case a kept route exists for)
        holder = next((h for h in candidates if h.node_id == node_id and h.start <= start and end <= h.end
                       and (not h.whole or (start, end) == (0, n_layers))), None)
        if holder is None:
            return None
        chain.append(replace(holder, start=start, end=end))
    return _with_standbys(chain, _prune(candidates), n_layers, True)
