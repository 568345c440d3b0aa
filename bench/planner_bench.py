"""How long `plan_route` takes over simulated swarms (pure: no network, no model).

    python bench/planner_bench.py [--layers 80] [--sizes 10,100,1000] [--calls 50] [--seed 1]

Each swarm: N holders over an L-layer model, each a random contiguous window of 4 to L/2 layers
(a third of them on one of a few popular windows, as layer choice makes them cluster), ms/layer
0.3-5, RTT 1-80 ms, one holder local, a tenth relayed, one whole-model holder in ten swarms. Prints
per size the median and worst milliseconds per call (the chain and a standby chain per segment)
and the median CPU time (steadier on a shared machine), also without standbys (`standbys=False`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.errors import InsufficientCapacity  # noqa: E402
from node.inference.pipeline.planner import Holder, plan_route  # noqa: E402


def swarm(rng: random.Random, n: int, layers: int) -> list[Holder]:
    popular = [(s, min(layers, s + rng.randint(4, layers // 2))) for s in rng.sample(range(layers - 4), 6)]
    out = []
    for i in range(n):
        if rng.random() < 1 / 3:
            start, end = rng.choice(popular)
        else:
            size = rng.randint(4, layers // 2)
            start = rng.randint(0, layers - size)
            end = start + size
        transport = "local" if i == 0 else ("relayed" if rng.random() < 0.1 else "direct")
        out.append(Holder(f"{i:064x}", start, end, transport, rng.uniform(1, 80), rng.uniform(0.3, 5.0)))
    if rng.random() < 0.1:
        out.append(Holder("f" * 64, 0, layers, "direct", rng.uniform(1, 80), rng.uniform(0.3, 5.0), whole=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"plan_route over an {args.layers}-layer model, {args.calls} swarms per size")
    for n in (int(s) for s in args.sizes.split(",")):
        times, cpu, chain_cpu, segs, standby = [], [], [], [], 0
        for _ in range(args.calls):
            holders = swarm(rng, n, args.layers)
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                plan = plan_route(args.layers, holders)
            except InsufficientCapacity:
                plan = None
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            c0 = time.process_time()
            try:
                plan_route(args.layers, holders, standbys=False)
            except InsufficientCapacity:
                pass
            chain_cpu.append((time.process_time() - c0) * 1000)
            if plan is None:
                continue
            segs.append(len(plan.segments))
            standby += sum(1 for s in plan.standbys if s)
        print(f"holders={n:5d}  median_ms={statistics.median(times):7.2f}  max_ms={max(times):7.2f}  "
              f"median_cpu_ms={statistics.median(cpu):7.2f}  chain_only_cpu_ms={statistics.median(chain_cpu):7.2f}  "
              f"segments_median={statistics.median(segs) if segs else '-'}  "
              f"segments_with_standby={standby}/{sum(segs)}")


if __name__ == "__main__":
    main()
