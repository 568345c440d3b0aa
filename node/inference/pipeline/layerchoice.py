"""Which contiguous layers of a model this node should serve (`--serve auto`): pure functions.

The rule follows Petals' `block_selection.py` (the idea, not its code): every layer has a strength,
the summed throughput of its holders (throughput = 1000 / ms per layer: layer steps per second),
and a node serves the window of layers whose sorted strengths are lexicographically smallest —
the weakest-covered stretch of the model — sized by its memory budget. Here the strength is first
the holder count capped at the swarm's target (`redundancy_target`: REDUNDANCY = 2, or 3 where
the ranges hold a spare copy beyond that, so that a single leave never drops a layer below two),
then throughput: a layer with fewer holders is weaker than any with more, however fast they are.

A node re-evaluates on joins, leaves and periodically, and moves (`should_move`) only when the
swarm clearly gains. Below the floor (a layer with one holder): the minimum capped count rises, or
fewer layers are at it. Between the floor and the target: the move lifts every layer at the
minimum at once, or, on the periodic round only, fewer layers are at it and every layer the mover
drops keeps the target (surplus holders only, so one leave does not start a cascade of moves).
At the target, on the periodic round only: the weakest throughput rises by more than
1 / BALANCE_QUALITY (autoserve.py acts on a move for throughput alone, `Decision.for_throughput`, once
AUTO_SERVE_BALANCE_ROUNDS periodic rounds in a row found it: measured speeds are noisy). Never when
the layers it would drop have no other holder; a move's commit re-checks on fresh adverts that no
layer falls below the floor (`thinned_by_drop`). Each move raises this (count, −weak layers,
throughput) quality strictly, so at a fixed target and speeds moves cannot cycle. When several
nodes would gain by moving on the same snapshot, only the first moves
(`first_mover`: below the floor, the narrowest node that lifts every thin layer at once, its load
being the shortest; else by a seeded node-id hash): every node computes the same answer from the
same adverts, so nodes that start or react together do not all jump to the same window. Ties
between equally weak windows are broken the same way (aligned tiles first, then the hash).

No network, no torch, no clock: the node (autoserve.py) and bench/swarm_sim.py feed snapshots.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

REDUNDANCY = 2  # holders per layer the choice aims for before it weighs throughput, at least
MAX_REDUNDANCY = 3  # ... and at most, where the swarm holds enough copies (see redundancy_target)
SPARE_COPIES = 1  # copies of the model held beyond the target: slack for windows that do not tile
BALANCE_QUALITY = 0.75  # move only when min throughput before < this × after (Petals' figure)
DEFAULT_MS_PER_LAYER = 2.0  # a holder nobody has measured yet (as the planner assumes)
_COUNT_WEIGHT = 1e12  # strength = min(count, REDUNDANCY) × this + throughput (throughput ≪ this)


@dataclass(frozen=True)
class Span:
    """One node's served range [start, end) of a model and its speed."""

    node_id: str
    start: int
    end: int
    ms_per_layer: float | None = None

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def throughput(self) -> float:
        """Layer steps per second this holder adds to each of its layers."""
        ms = self.ms_per_layer if self.ms_per_layer else DEFAULT_MS_PER_LAYER
        return 1000.0 / ms

    def moved_to(self, start: int, end: int) -> Span:
        return Span(self.node_id, start, end, self.ms_per_layer)


@dataclass(frozen=True)
class LayerBudget:
    """How many layers fit: `layers` for a range without the model's last layer, `with_head` for
    one that ends at the last layer (the output norm and head must fit too)."""

    layers: int
    with_head: int

    def fits(self, start: int, end: int, n_layers: int) -> bool:
        return end - start <= (self.with_head if end == n_layers else self.layers)


@dataclass(frozen=True)
class Quality:
    """The swarm's weakest layer: capped holder count, how many layers are that weak, and the
    weakest summed throughput among them."""

    min_count: int
    n_weakest: int
    min_throughput: float
    target: int = REDUNDANCY  # the capped holder count this quality was measured against

    def describe(self) -> str:
        return f"min_holders={self.min_count}x{self.n_weakest}layers,min_tput={self.min_throughput:.0f}"


@dataclass(frozen=True)
class Decision:
    """A choice of range, the swarm quality before and after it, and why."""

    start: int
    end: int
    before: Quality
    after: Quality
    reason: str

    @property
    def range_text(self) -> str:
        return f"{self.start}-{self.end - 1}"

    @property
    def for_throughput(self) -> bool:
        """A move that gains throughput alone, at or above the floor: the weakest capped count (and,
        below the target, how many layers are at it) stays as it was, so measured speeds alone
        justify it, and their noise can (autoserve.py confirms it over several periodic rounds).
        Below the floor a move is a repair, whatever it gains: never delayed."""
        b, a = self.before, self.after
        return b.min_count >= REDUNDANCY and a.min_count == b.min_count and (
            b.min_count >= b.target or a.n_weakest == b.n_weakest)


def layers_for_budget(budget_bytes: int, per_layer_bytes: int, kv_per_layer_bytes: int, head_bytes: int,
                      *, headroom_bytes: int = 0, n_layers: int | None = None) -> LayerBudget:
    """Layers that fit in `budget_bytes − headroom_bytes`, each costing its weights at the slice
    dtype plus the KV cache it must reserve at the node's max context; a range ending at the last
    layer must also hold the output head. Capped at n_layers when given."""
    if per_layer_bytes + kv_per_layer_bytes <= 0:
        raise ValueError("a layer must cost some bytes")
    room = max(0, int(budget_bytes) - int(headroom_bytes))
    per = int(per_layer_bytes) + int(kv_per_layer_bytes)
    plain = room // per
    with_head = max(0, room - int(head_bytes)) // per
    if n_layers is not None:
        plain, with_head = min(plain, n_layers), min(with_head, n_layers)
    return LayerBudget(int(plain), int(with_head))


def redundancy_target(n_layers: int, held_layers: int) -> int:
    """Holders per layer to aim for when the swarm's ranges hold `held_layers` layers in all
    (Σ range lengths): REDUNDANCY, raised towards MAX_REDUNDANCY while the swarm holds at least
    SPARE_COPIES more copies of the model than that. With three holders a single leave never
    drops a layer below two; without the spare copy, ranges that do not tile would chase a count
    the swarm cannot reach."""
    if n_layers <= 0:
        return REDUNDANCY
    copies = held_layers // n_layers
    return int(min(MAX_REDUNDANCY, max(REDUNDANCY, copies - SPARE_COPIES)))


@functools.lru_cache(maxsize=4096)
def _tie(seed: int, node_id: str, start: int) -> int:
    """A stable pseudo-random rank of (node, window start) under a seed."""
    digest = hashlib.blake2b(f"{seed}:{node_id}:{start}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _tie_row(seed: int, node_id: str, n: int) -> np.ndarray:
    """_tie-like ranks for window starts 0..n-1 of one node (one generator, not n hashes)."""
    return np.random.default_rng([seed, _tie(seed, node_id, -2)]).random(n)


def _diff(n_layers: int, spans: Iterable[Span], weight) -> np.ndarray:
    spans = list(spans)
    diff = np.zeros(n_layers + 1, dtype=np.float64)
    if spans:
        starts = np.clip(np.fromiter((s.start for s in spans), np.int64, len(spans)), 0, n_layers)
        ends = np.clip(np.fromiter((s.end for s in spans), np.int64, len(spans)), 0, n_layers)
        w = np.fromiter((weight(s) for s in spans), np.float64, len(spans))
        np.add.at(diff, starts, w)
        np.add.at(diff, ends, -w)
    return np.cumsum(diff[:-1])


def layer_counts(n_layers: int, spans: Iterable[Span]) -> np.ndarray:
    """Holders per layer."""
    return np.rint(_diff(n_layers, spans, lambda s: 1.0)).astype(np.int64)


def layer_throughput(n_layers: int, spans: Iterable[Span]) -> np.ndarray:
    """Summed throughput per layer."""
    return _diff(n_layers, spans, lambda s: s.throughput)


class _Cover:
    """Per-layer holder counts and summed throughput of a set of spans (cheap to edit)."""

    def __init__(self, n_layers: int, spans: Sequence[Span], target: int | None = None):
        self.n_layers = n_layers
        spans = list(spans)
        # one pass over the spans for both arrays (this runs on every peer event, on every node)
        starts = np.clip(np.fromiter((s.start for s in spans), np.int64, len(spans)), 0, n_layers)
        ends = np.clip(np.fromiter((s.end for s in spans), np.int64, len(spans)), 0, n_layers)
        tputs = np.fromiter((s.throughput for s in spans), np.float64, len(spans))
        diff = np.zeros((2, n_layers + 1), dtype=np.float64)
        np.add.at(diff[0], starts, 1.0)
        np.add.at(diff[0], ends, -1.0)
        np.add.at(diff[1], starts, tputs)
        np.add.at(diff[1], ends, -tputs)
        sums = np.cumsum(diff[:, :-1], axis=1)
        self.counts, self.tput = np.rint(sums[0]), sums[1]
        if target is None:
            target = redundancy_target(n_layers, int(np.rint(self.counts.sum())))
        self.target = target  # kept by edited(): before and after a change compare at one target

    def edited(self, remove: Span | None = None, add: tuple[int, int, float] | None = None) -> _Cover:
        out = object.__new__(_Cover)
        out.n_layers, out.counts, out.tput = self.n_layers, self.counts.copy(), self.tput.copy()
        out.target = self.target
        if remove is not None:
            out.counts[remove.start:remove.end] -= 1
            out.tput[remove.start:remove.end] -= remove.throughput
        if add is not None:
            start, end, throughput = add
            out.counts[start:end] += 1
            out.tput[start:end] += throughput
        return out

    def strength(self) -> np.ndarray:
        counts = self.capped()
        return counts * _COUNT_WEIGHT + np.where(counts > 0, np.maximum(self.tput, 0.0), 0.0)

    def capped(self) -> np.ndarray:
        return np.minimum(np.rint(self.counts), self.target)

    def quality(self) -> Quality:
        if self.n_layers <= 0:
            return Quality(0, 0, 0.0, self.target)
        capped = self.capped()
        count = int(capped.min())
        weakest = float(self.strength().min())
        return Quality(count, int(np.sum(capped == count)), weakest - count * _COUNT_WEIGHT, self.target)


def quality(n_layers: int, spans: Sequence[Span]) -> Quality:
    """The swarm's weakest layer for these spans: its capped holder count and throughput."""
    return _Cover(n_layers, spans).quality()


def _candidates(n_layers: int, budget: LayerBudget) -> list[tuple[int, int]]:
    """Every window the budget allows: the widest that fits at each start."""
    if budget.with_head >= n_layers:
        return [(0, n_layers)]
    out = [(s, s + budget.layers) for s in range(0, n_layers - budget.layers)] if budget.layers > 0 else []
    if budget.with_head > 0:
        out.append((n_layers - budget.with_head, n_layers))
    return out


def _best_window(cover: _Cover, budget: LayerBudget, node_id: str, seed: int,
                 held: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    n_layers = cover.n_layers
    options = _candidates(n_layers, budget)
    if not options:
        return None
    width = max(end - start for start, end in options)
    plain = [i for i, (start, end) in enumerate(options) if end - start == budget.layers and end < n_layers]

    def sorted_rows(values: np.ndarray) -> list[np.ndarray]:
        """Each window's values sorted ascending, as sort keys (column 0 = its weakest layer)."""
        rows = np.full((len(options), width), np.inf)
        if plain:  # the windows of the plain width, sorted in one go
            windows = np.lib.stride_tricks.sliding_window_view(values, budget.layers)
            first = options[plain[0]][0]
            rows[plain[0]:plain[-1] + 1, : budget.layers] = np.sort(windows[first:first + len(plain)], axis=1)
        for i, (start, end) in enumerate(options):
            if not plain or not plain[0] <= i <= plain[-1]:
                rows[i, : end - start] = np.sort(values[start:end])
        return [rows[:, c] for c in range(width - 1, -1, -1)]

    starts = np.array([start for start, _ in options])
    unaligned = np.array([not (start % (end - start) == 0 or end == n_layers) for start, end in options])
    tie = _tie_row(seed, node_id, n_layers + 1)[starts]
    # np.lexsort: the last key is the primary one (the weakest layer of each window first)
    keys = [tie, unaligned, *sorted_rows(cover.strength())]
    if held:  # a partial model: of windows with the same holder counts, the one needing the fewest
        # layers fetched (a layer not on this disk costs a download; an unreachable origin, a failure)
        missing = np.array([sum(1 for i in range(start, end) if i not in held) for start, end in options])
        keys += [missing, *sorted_rows(cover.capped().astype(float))]
    return options[int(np.lexsort(keys)[0])]


def best_window(n_layers: int, others: Sequence[Span], budget: LayerBudget, node_id: str,
                seed: int = 0, held: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    """The weakest-covered window this budget fits (None when not even one layer fits): the
    lexicographically smallest sorted strengths (for a partial model, `held` = the layers on this
    node's disk: the smallest sorted holder counts, then the fewest layers not held, then the
    strengths), then an aligned tile (start a multiple of
    the width, or ending at the last layer), then a seeded node-id hash."""
    return _best_window(_Cover(n_layers, others), budget, node_id, seed, held)


def choose_range(n_layers: int, others: Sequence[Span], budget: LayerBudget, node_id: str,
                 seed: int = 0, ms_per_layer: float | None = None,
                 held: frozenset[int] = frozenset()) -> Decision | None:
    """First choice of a node that serves nothing yet: the weakest window it fits (of equally
    weak ones, the one whose layers are on disk already)."""
    cover = _Cover(n_layers, others)
    window = _best_window(cover, budget, node_id, seed, held)
    if window is None:
        return None
    after = cover.edited(add=(*window, Span(node_id, *window, ms_per_layer).throughput)).quality()
    reason = "whole model fits" if window == (0, n_layers) else "weakest coverage"
    return Decision(*window, cover.quality(), after, reason)


def uncovered_without(n_layers: int, spans: Sequence[Span], node_id: str, start: int, end: int) -> list[int]:
    """Layers of [start, end) that no span of another node covers."""
    counts = layer_counts(n_layers, [s for s in spans if s.node_id != node_id])
    return [layer for layer in range(max(0, start), min(end, n_layers)) if counts[layer] == 0]


def thinned_by_drop(n_layers: int, spans: Sequence[Span], node_id: str, start: int, end: int) -> list[int]:
    """Layers of [start, end) that would fall below the swarm's floor if `node_id` dropped that
    range (the commit of a move, on the adverts of the moment; `spans` include the new range
    when it is loaded). The floor is REDUNDANCY holders, or the weakest layer's count now where
    that is lower, and at least one: a repair below the floor may still thin a layer down to the
    floor, but two moves decided on different snapshots never take a layer from two holders to one.
    The weakest count is the swarm's without this node's new range: counted with it, a repair that
    lifts the only thin layer while thinning another to the same count (a clear gain in
    throughput, which `should_move` proposes) was aborted after every load, and proposed again
    at the next round (a swarm test, 2026-12-06: a load, an abort and a re-download every round)."""
    counts = layer_counts(n_layers, [s for s in spans if s.node_id != node_id or (s.start, s.end) == (start, end)])
    if n_layers <= 0:
        return []
    floor = max(1, min(REDUNDANCY, int(counts.min())))
    keep = layer_counts(n_layers, [s for s in spans if not (s.node_id == node_id and (s.start, s.end) == (start, end))])
    return [layer for layer in range(max(0, start), min(end, n_layers)) if keep[layer] < floor]


def gains_clearly(before: Quality, after: Quality, balance_quality: float = BALANCE_QUALITY) -> bool:
    """Hysteresis: more capped holders on the weakest layer; or, below REDUNDANCY, fewer layers
    that weak; or at equal count a weakest throughput that rises by more than 1 / balance_quality
    (never a loss of count)."""
    if after.min_count != before.min_count:
        return after.min_count > before.min_count
    if before.min_count < before.target and after.n_weakest != before.n_weakest:
        return after.n_weakest < before.n_weakest
    return after.min_throughput > 0 and before.min_throughput < balance_quality * after.min_throughput


def _should_move(total: _Cover, me: Span, budget: LayerBudget, node_id: str, seed: int,
                 balance_quality: float, balance: bool = True) -> Decision | None:
    if not balance and total.quality().min_count >= total.target:
        return None  # holder counts are at the target: throughput is balanced only periodically
    others = total.edited(remove=me)
    window = _best_window(others, budget, node_id, seed)
    if window is None or window == (me.start, me.end):
        return None
    dropped = [layer for layer in range(me.start, me.end) if not window[0] <= layer < window[1]]
    if any(others.counts[layer] < 0.5 for layer in dropped):
        return None  # the move would leave a layer with no holder
    before = total.quality()
    after = others.edited(add=(*window, me.throughput)).quality()
    if REDUNDANCY <= before.min_count < total.target and after.min_count <= before.min_count and not (
            balance and all(others.counts[layer] > total.target - 0.5 for layer in dropped)):
        # between the floor and the target: a move that lifts every weakest layer at once; one
        # that lifts only some, on the periodic round alone and only from surplus holders
        return None
    if not gains_clearly(before, after, balance_quality):
        return None
    return Decision(*window, before, after, "clear gain")


def should_move(n_layers: int, spans: Sequence[Span], node_id: str, budget: LayerBudget, seed: int = 0,
                balance_quality: float = BALANCE_QUALITY, balance: bool = True) -> Decision | None:
    """Where this node should move its range (a Decision), or None to stay.

    `spans` is the whole swarm including this node's one current span. A move is proposed only
    when the layers it would drop keep another holder and the swarm gains clearly. With
    `balance` False (a peer event, not the periodic re-evaluation) only holder counts below the
    target move a node; throughput is balanced on the periodic round alone."""
    mine = [s for s in spans if s.node_id == node_id]
    if len(mine) != 1:
        return None  # not serving, or mid-move (old and new range both held): nothing to decide
    return _should_move(_Cover(n_layers, spans), mine[0], budget, node_id, seed, balance_quality, balance)


def first_mover(n_layers: int, spans: Sequence[Span], budgets: dict[str, LayerBudget], seed: int = 0,
                balance_quality: float = BALANCE_QUALITY, balance: bool = True) -> tuple[str, Decision] | None:
    """Of the nodes (with known budgets) that would gain by moving on this snapshot, the one that
    goes first by the seeded hash; the others wait for the next snapshot. Deterministic, so every
    node computing it from the same adverts agrees.

    Once every layer has REDUNDANCY holders, a node holding any of the weakest layers (below
    the throughput a clear gain needs) can never gain by moving (it would lower or keep one of
    them), nor can one narrower than their extent; those are skipped before the exact check."""
    total = _Cover(n_layers, spans)
    before = total.quality()
    weak = np.zeros(0, dtype=np.int64)
    between = REDUNDANCY <= before.min_count < total.target
    if not balance and before.min_count >= total.target:
        return None  # see should_move
    if between and not balance:  # a mover must lift every layer at the minimum count at once (see _should_move)
        weak = np.flatnonzero(total.capped() == before.min_count)
    elif before.min_count >= total.target:
        threshold = total.target * _COUNT_WEIGHT + before.min_throughput / balance_quality
        weak = np.flatnonzero(total.strength() <= threshold)
    lo, hi = (int(weak.min()), int(weak.max()) + 1) if weak.size else (0, 0)
    by_node: dict[str, list[Span]] = {}
    for s in spans:
        by_node.setdefault(s.node_id, []).append(s)
    movable = [(node_id, found[0]) for node_id, found in by_node.items() if node_id in budgets and len(found) == 1]
    if not movable:
        return None
    # the necessary conditions, for every node at once
    starts = np.array([me.start for _, me in movable])
    ends = np.array([me.end for _, me in movable])
    widths = np.array([max(budgets[node_id].layers, budgets[node_id].with_head) for node_id, _ in movable])
    tputs = np.array([me.throughput for _, me in movable])
    ok = np.ones(len(movable), dtype=bool)
    if weak.size:
        ok &= widths >= hi - lo
        if not between:
            ok &= tputs > before.min_throughput * (1 / balance_quality - 1)  # even on the weakest layer
        inside = np.zeros(n_layers + 1, dtype=np.int64)
        inside[1:] = np.cumsum(np.isin(np.arange(n_layers), weak))
        ok &= inside[ends] - inside[starts] == 0  # holds none of the weakest layers
    # below the floor the repair is urgent: of the movers wide enough to lift every thin layer at
    # once, the narrowest loads soonest, so it goes first; then the others, by the hash
    rank = np.zeros(len(movable), dtype=np.int64)
    if before.min_count < REDUNDANCY:
        thin = np.flatnonzero(total.capped() < REDUNDANCY)
        extent = int(thin.max()) + 1 - int(thin.min())
        rank = np.where(widths >= extent, widths, n_layers + 1)
    ranked = sorted((int(rank[i]), _tie(seed, movable[i][0], -1), i) for i in np.flatnonzero(ok))
    for *_, i in ranked:
        node_id, me = movable[i]
        decision = _should_move(total, me, budgets[node_id], node_id, seed, balance_quality, balance)
        if decision is not None:
            return node_id, decision
    return None


def gaps(n_layers: int, spans: Sequence[Span]) -> list[tuple[int, int]]:
    """Stretches [a, b) of layers with no holder."""
    counts = layer_counts(n_layers, spans)
    out: list[tuple[int, int]] = []
    start = None
    for layer in range(n_layers):
        if counts[layer] == 0 and start is None:
            start = layer
        elif counts[layer] != 0 and start is not None:
            out.append((start, layer))
            start = None
    if start is not None:
        out.append((start, n_layers))
    return out
