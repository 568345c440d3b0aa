"""Scale, by simulation: automatic layer choice and route planning over swarms of 10 to 1,000 nodes.

    python bench/swarm_sim.py                      # 10, 100 and 1,000 nodes, 80 layers, 5 % churn/min
    python bench/swarm_sim.py --nodes 100 --minutes 120 --churn 0.05 --seed 3

Drives the real pure functions (no network, no clock, no sleeping; simulated time only):
`node.inference.pipeline.layerchoice` (first choice, `first_mover` / `should_move`, the never-
uncover check at commit) and `node.inference.pipeline.planner.plan_route`.

The swarm. Nodes have mixed memory and speed: a quarter are GPU-like (0.2-0.8 ms/layer, 16-80 GiB
for slices), the rest CPU-like (2-10 ms/layer, 6-48 GiB); each has a latency to the coordinator
(RTT 4-60 ms, log-uniform). The model is 80-layer, 70B-shaped: 0.86 GiB of int8 weights per
layer + 0.03 GiB of KV reserve at 8 k context, a 1 GiB head. Churn `c` per minute means c × N
leaves per minute (abrupt, as a SIGKILL) and as many joins (the population stays near N); events
are Poisson (each leave brings a new node within a minute). The initial N nodes join within the first 30 s; figures count from `--warmup`.

A node behaves as the real one does (node/inference/pipeline/autoserve.py): a joiner waits a
random 0-2 s plus 1 s to see the swarm, chooses the weakest window its budget fits, loads it
(`--load-s-per-layer` × layers: it serves nothing until then) and announces it. On every
announce or leave, nodes react after 0.5-1.5 s (`first_mover` for holder counts only), and each
also every 120 s ± 20 % (the periodic round, which also balances throughput): all compute
`first_mover` on the same adverts, and only that node moves. A move loads the new range while
the old one keeps serving, then re-checks that dropping the old range takes no layer below the
floor (`thinned_by_drop`; else it aborts and keeps the old range), then switches.

Chain estimate (sampled every `--plan-every` s): holders are the serving ranges, each with its
ms/layer and RTT, given as they are to the node's own `plan_route` (which uses any sub-range of a
holder's range; ranges may overlap). Two references:
  best (placed)  the cheapest chain over the current placement with any sub-range of any holder,
                 a node allowed more than once: a lower bound for any planner on these ranges;
  best (ideal)   the cheapest chain if the swarm's live nodes could hold any layers within their
                 budgets (a 0/1 knapsack over nodes: Σ ms/layer × layers + RTT/2 per node, + the
                 RTT/2 back from the last one): what placement could give.
Estimate = Σ ms/layer × layers + ½ RTT into each segment + ½ RTT back from the last (the planner's).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.errors import InsufficientCapacity  # noqa: E402
from node.inference.pipeline import layerchoice as lc  # noqa: E402
from node.inference.pipeline.planner import Holder, plan_route  # noqa: E402
from node.sysinfo import cpu_name  # noqa: E402

GIB = 2**30
LAYER_BYTES = int(0.86 * GIB)
KV_BYTES = int(0.03 * GIB)
HEAD_BYTES = 1 * GIB
REACT_S = (0.5, 1.5)
START_DELAY_S = 2.0
LOOK_S = 1.0
REEVAL_S = 120.0


@dataclass
class SimNode:
    node_id: str
    budget: lc.LayerBudget
    ms_per_layer: float
    rtt_ms: float
    serving: tuple[int, int] | None = None
    loading: tuple[int, int] | None = None
    alive: bool = True


@dataclass
class Stats:
    t_measured: float = 0.0
    t_cover1: float = 0.0
    t_cover2: float = 0.0
    joins: int = 0
    leaves: int = 0
    moves: int = 0
    aborted: int = 0
    moves_by_event: dict[int, int] = field(default_factory=dict)
    samples: list[tuple[float, float | None, float, float]] = field(default_factory=list)
    capacity: list[float] = field(default_factory=list)  # Σ budgets / layers of live nodes, per sample


def _cost_tables(n_layers: int, holders: list[Holder]) -> tuple[np.ndarray, np.ndarray]:
    """cost[h, a, b] = ms/layer × (b − a) + hop of holder h for a sub-range [a, b) it holds (inf
    elsewhere), shape (H, L+1, L+1); and the hop of each holder."""
    a = np.arange(n_layers + 1)[:, None]
    b = np.arange(n_layers + 1)[None, :]
    rates = np.array([h.ms_per_layer for h in holders])[:, None, None]
    hops = np.array([h.hop_ms() for h in holders])
    starts = np.array([h.start for h in holders])[:, None, None]
    ends = np.array([h.end for h in holders])[:, None, None]
    inside = (a[None] >= starts) & (b[None] <= ends) & (b[None] > a[None])
    cost = np.where(inside, rates * (b - a)[None] + hops[:, None, None], np.inf)
    return cost, hops


def best_placed(n_layers: int, holders: list[Holder]) -> float:
    """Cheapest chain with any sub-range of any holder (a node may appear twice)."""
    cost, hops = _cost_tables(n_layers, holders)
    mid = cost.min(axis=0)
    last = (cost + hops[:, None, None]).min(axis=0)  # the last segment also pays the way back
    best = np.full(n_layers + 1, np.inf)
    best[0] = 0.0
    for b in range(1, n_layers + 1):
        best[b] = np.min(best[:b] + (last[:b, b] if b == n_layers else mid[:b, b]))
    return float(best[n_layers])


def best_ideal(n_layers: int, nodes: list[SimNode]) -> float:
    """The cheapest chain if live nodes could hold any layers within their budgets: a 0/1
    knapsack over nodes (Σ ms/layer × layers + RTT/2 into each), one of them last (+ its RTT/2
    back)."""
    inf = np.full(n_layers + 1, np.inf)
    mid, last = inf.copy(), inf.copy()  # [l] = cheapest l layers assigned, without / with the last node
    mid[0] = 0.0
    for n in sorted(nodes, key=lambda n: n.ms_per_layer)[:200]:  # the 200 fastest bound the optimum
        cap = min(n.budget.layers, n_layers)
        if cap <= 0:
            continue
        new_mid, new_last = mid.copy(), last.copy()
        for x in range(1, cap + 1):
            cost = n.ms_per_layer * x + n.rtt_ms / 2
            new_mid[x:] = np.minimum(new_mid[x:], mid[:-x] + cost)
            new_last[x:] = np.minimum(new_last[x:], np.minimum(last[:-x] + cost, mid[:-x] + cost + n.rtt_ms / 2))
        mid, last = new_mid, new_last
    return float(last[n_layers])


class Sim:
    """One simulated swarm over simulated time."""

    def __init__(self, n_nodes: int, n_layers: int, churn: float, minutes: float, warmup_min: float, seed: int,
                 load_s_per_layer: float, plan_every_s: float, mem_scale: float = 1.0):
        self.mem_scale = mem_scale
        self.rng = random.Random(seed)
        self.seed = seed
        self.n_nodes, self.n_layers = n_nodes, n_layers
        self.churn, self.end_s, self.warmup_s = churn, minutes * 60.0, warmup_min * 60.0
        self.load_s_per_layer, self.plan_every_s = load_s_per_layer, plan_every_s
        self.nodes: dict[str, SimNode] = {}
        self.queue: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.last_change = 0.0
        self.version = 0
        self._mover_cache: tuple[int, dict[bool, tuple[str, lc.Decision] | None]] | None = None
        self._spans: tuple[int, list[lc.Span]] | None = None
        self.last_event = -1  # id of the latest join/leave (moves are attributed to it)
        self.stats = Stats()
        self.ids = itertools.count()

    # --- the model of a node ---

    def new_node(self) -> SimNode:
        gpu = self.rng.random() < 0.25
        if gpu:
            mem_gib, ms = self.rng.choice([16, 24, 40, 48, 80]), self.rng.uniform(0.2, 0.8)
        else:
            mem_gib, ms = self.rng.choice([6, 8, 12, 16, 24, 32, 48]), self.rng.uniform(2.0, 10.0)
        budget = lc.layers_for_budget(int(mem_gib * self.mem_scale * GIB), LAYER_BYTES, KV_BYTES, HEAD_BYTES, n_layers=self.n_layers)
        rtt = math.exp(self.rng.uniform(math.log(4), math.log(60)))
        return SimNode(f"{next(self.ids):06d}{self.rng.getrandbits(64):016x}", budget, ms, rtt)

    def spans(self) -> list[lc.Span]:
        """The serving ranges (what adverts say), rebuilt only when they changed."""
        if self._spans is None or self._spans[0] != self.version:
            self._spans = (self.version, [lc.Span(n.node_id, *n.serving, n.ms_per_layer)
                                          for n in self.nodes.values() if n.serving])
        return self._spans[1]

    def budgets(self) -> dict[str, lc.LayerBudget]:
        return {n.node_id: n.budget for n in self.nodes.values()}

    # --- events ---

    def at(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.queue, (t, next(self.seq), kind, payload))

    def changed(self) -> None:
        """Serving sets changed (coverage was accounted up to now just before): everyone reacts."""
        self.version += 1
        self.at(self.now + self.rng.uniform(*REACT_S), "react")

    def account(self) -> None:
        lo = max(self.last_change, self.warmup_s)
        if self.now > lo:
            counts = lc.layer_counts(self.n_layers, self.spans())
            dt = self.now - lo
            self.stats.t_measured += dt
            self.stats.t_cover1 += dt if counts.min() >= 1 else 0.0
            self.stats.t_cover2 += dt if counts.min() >= 2 else 0.0
        self.last_change = self.now

    def join(self) -> None:
        node = self.new_node()
        self.nodes[node.node_id] = node
        if self.now >= self.warmup_s:
            self.stats.joins += 1
            self.last_event = next(self.seq)
        self.at(self.now + self.rng.uniform(0, START_DELAY_S) + LOOK_S, "choose", node.node_id)
        self.at(self.now + self.rng.uniform(0.8, 1.2) * REEVAL_S, "tick", node.node_id)

    def leave(self) -> None:
        if not self.nodes:
            return
        self.account()  # the state that held until now
        node = self.nodes.pop(self.rng.choice(sorted(self.nodes)))
        node.alive = False
        if self.now >= self.warmup_s:
            self.stats.leaves += 1
            self.last_event = next(self.seq)
        if node.serving:
            self.changed()
        else:
            self.version += 1  # (its budget left the snapshot)

    def choose(self, node_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return
        d = lc.choose_range(self.n_layers, self.spans(), node.budget, node_id, self.seed, node.ms_per_layer)
        if d is None:
            return  # nothing fits: the node serves no layers
        node.loading = (d.start, d.end)
        self.at(self.now + self.load_s_per_layer * (d.end - d.start), "loaded", node_id)

    def mover(self, balance: bool) -> tuple[str, lc.Decision] | None:
        """first_mover on the current adverts (the same on every node, so computed once per state);
        `balance` on the periodic round only (a peer event moves nodes for holder counts alone)."""
        if self._mover_cache is None or self._mover_cache[0] != self.version:
            self._mover_cache = (self.version, {})
        found = self._mover_cache[1]
        if True not in found:
            found[True] = lc.first_mover(self.n_layers, self.spans(), self.budgets(), self.seed, balance=True)
        if balance not in found:  # (no mover on the periodic round: none on a peer event either)
            found[False] = None if found[True] is None else lc.first_mover(
                self.n_layers, self.spans(), self.budgets(), self.seed, balance=False)
        return found[balance]

    def react(self, node_id: str | None = None) -> None:
        found = self.mover(balance=node_id is not None)
        if found is None:
            return
        mover_id, decision = found
        node = self.nodes[mover_id]
        if node_id is not None and node_id != mover_id:
            return  # a periodic tick of another node: only the mover acts
        if node.loading is not None:
            return  # already moving
        node.loading = (decision.start, decision.end)
        if self.now >= self.warmup_s:
            self.stats.moves += 1
            self.stats.moves_by_event[self.last_event] = self.stats.moves_by_event.get(self.last_event, 0) + 1
        self.at(self.now + self.load_s_per_layer * (decision.end - decision.start), "loaded", mover_id)

    def loaded(self, node_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is None or node.loading is None:
            return
        new, old = node.loading, node.serving
        node.loading = None
        if old is not None:
            # commit: dropping the old range must leave its layers at the swarm's floor of holders
            now = self.spans() + [lc.Span(node_id, *new)]
            if lc.thinned_by_drop(self.n_layers, now, node_id, *old):
                self.stats.aborted += 1
                self._mover_cache = None
                return
        self.account()
        node.serving = new
        self.changed()

    def tick(self, node_id: str) -> None:
        if node_id not in self.nodes:
            return
        self.react(node_id)
        self.at(self.now + self.rng.uniform(0.8, 1.2) * REEVAL_S, "tick", node_id)

    def sample(self) -> None:
        holders = [Holder(n.node_id, *n.serving, "direct", n.rtt_ms, n.ms_per_layer)
                   for n in self.nodes.values() if n.serving]
        if not holders:
            return
        try:
            planned = plan_route(self.n_layers, holders, standbys=False).est_ms
        except InsufficientCapacity:
            planned = None
        placed = best_placed(self.n_layers, holders)
        ideal = best_ideal(self.n_layers, list(self.nodes.values()))
        self.stats.samples.append((self.now, planned, placed, ideal))
        self.stats.capacity.append(sum(n.budget.layers for n in self.nodes.values()) / self.n_layers)

    def run(self) -> Stats:
        for _ in range(self.n_nodes):
            self.at(self.rng.uniform(0, 30.0), "join")
        rate_per_s = self.churn * self.n_nodes / 60.0
        if rate_per_s > 0:  # Poisson leaves; each brings a new node within a minute
            t = 30.0
            while t < self.end_s:
                t += self.rng.expovariate(rate_per_s)
                self.at(t, "leave")
                self.at(t + self.rng.uniform(0, 60.0), "join")
        t = self.warmup_s
        while t < self.end_s:
            self.at(t, "sample")
            t += self.plan_every_s
        while self.queue:
            t, _, kind, payload = heapq.heappop(self.queue)
            if t > self.end_s:
                break
            self.now = t
            if kind == "join":
                self.join()
            elif kind == "leave":
                self.leave()
            elif kind == "choose":
                self.choose(payload)
            elif kind == "loaded":
                self.loaded(payload)
            elif kind == "react":
                self.react()
            elif kind == "tick":
                self.tick(payload)
            elif kind == "sample":
                self.sample()
        self.now = self.end_s
        self.account()
        return self.stats


def report(n: int, args: argparse.Namespace, stats: Stats, wall_s: float) -> list[str]:
    events = stats.joins + stats.leaves
    per_event = list(stats.moves_by_event.values())
    ratios_placed = [p / b for _, p, b, _ in stats.samples if p is not None and b > 0]
    ratios_ideal = [p / i for _, p, _, i in stats.samples if p is not None and i > 0]
    planned_ok = sum(1 for s in stats.samples if s[1] is not None)
    cover1 = 100 * stats.t_cover1 / stats.t_measured if stats.t_measured else float("nan")
    cover2 = 100 * stats.t_cover2 / stats.t_measured if stats.t_measured else float("nan")

    def pct(values, q):
        values = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.percentile(values, q)) if values else float("nan")

    max_moves = max(per_event, default=0)

    def check(ok: bool) -> str:
        return "met" if ok else "NOT met"

    targets = (f"  targets (set for 100 nodes, 80 layers, 5 %/min): >=1 holder >=99.9% {check(cover1 >= 99.9)}, "
               f">=2 holders >=99% {check(cover2 >= 99.0)}, <=2 moves per event {check(max_moves <= 2)}, "
               f"chain within 10% of best placed (median) {check(pct(ratios_placed, 50) <= 1.10)}, "
               f"of best ideal (median) {check(pct(ratios_ideal, 50) <= 1.10)}")
    return [
        f"nodes={n} layers={args.layers} churn={args.churn:.0%}/min minutes={args.minutes:g} "
        f"(measured after {args.warmup:g}) seed={args.seed} load={args.load_s_per_layer:g} s/layer "
        f"mem_scale={args.mem_scale:g}",
        f"  joins={stats.joins} leaves={stats.leaves} (population at end {n}); capacity (sum of budgets / "
        f"layers) median {pct(stats.capacity, 50):.1f} min {pct(stats.capacity, 0):.1f}",
        f"  every layer >=1 holder: {cover1:.3f}% of the time   >=2 holders: {cover2:.3f}%",
        f"  moves: {stats.moves} started ({stats.aborted} aborted at commit), "
        f"{stats.moves / events if events else 0:.3f} per join/leave, at most {max(per_event, default=0)} "
        f"after one event",
        f"  chain (plan_route): found in {planned_ok}/{len(stats.samples)} samples",
        f"  planned / best(placed): median {pct(ratios_placed, 50):.3f} p95 {pct(ratios_placed, 95):.3f} "
        f"max {pct(ratios_placed, 100):.3f}",
        f"  planned / best(ideal):  median {pct(ratios_ideal, 50):.3f} p95 {pct(ratios_ideal, 95):.3f} "
        f"max {pct(ratios_ideal, 100):.3f}",
        f"  est ms/token: planned median {pct([s[1] for s in stats.samples if s[1] is not None], 50):.1f}, "
        f"best(placed) {pct([s[2] for s in stats.samples], 50):.1f}, "
        f"best(ideal) {pct([s[3] for s in stats.samples], 50):.1f}   (sim wall {wall_s:.1f} s)",
        targets,
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="10,100,1000", help="swarm sizes, comma-separated")
    p.add_argument("--layers", type=int, default=80)
    p.add_argument("--churn", type=float, default=0.05, help="leaves (and as many joins) per minute, × nodes")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=10.0, help="minutes before figures count")
    p.add_argument("--load-s-per-layer", type=float, default=2.0)
    p.add_argument("--plan-every", type=float, default=60.0, help="seconds between chain samples")
    p.add_argument("--mem-scale", type=float, default=1.0,
                   help="scale every node's memory (0.5: no node holds the whole 80-layer model)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    print(f"command: python bench/swarm_sim.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"cpu: {cpu_name()}")
    print(f"layer choice: redundancy {lc.REDUNDANCY}, {lc.MAX_REDUNDANCY} with {lc.SPARE_COPIES} spare copy, balance quality {lc.BALANCE_QUALITY}, re-evaluation "
          f"{REEVAL_S:g} s ± 20 %, reaction 0.5-1.5 s")
    for n in (int(x) for x in args.nodes.split(",")):
        started = time.monotonic()
        sim = Sim(n, args.layers, args.churn, args.minutes, args.warmup, args.seed, args.load_s_per_layer,
                  args.plan_every, args.mem_scale)
        stats = sim.run()
        print("\n".join(report(len(sim.nodes), args, stats, time.monotonic() - started)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
