"""Two checkouts' nodes side by side: decode tok/s of the same pipeline arm, alternating.

This VM's speed drifts by tens of percent within minutes, so a change is measured as pairs: each
round starts a fresh arm (`swarmllm run` processes, one per segment, as bench/pipeline_bench.py)
from one checkout, then from the other (the order flips every round), and takes the median of
`--streams` greedy streams. Printed: every pair, the medians and their ratio, the CPU.

    git worktree add /tmp/before HEAD~1      # (copy the built .so files into it: they are ignored)
    python bench/ab_checkouts.py --before /tmp/before --segments 3 --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.pipeline_bench import Arm, default_model  # noqa: E402
from node.models.gguf_meta import read_header  # noqa: E402
from node.sysinfo import cpu_name  # noqa: E402


async def arm_rate(repo: Path, model: Path, args) -> float:
    config = "" if args.speculation else "speculative_max_draft = 0\n"
    arm = Arm(model, read_header(model).n_layers, args.segments, args.threads, args.bits, config_toml=config, repo=repo)
    try:
        model_id = await arm.ready(model.stem)
        await arm.stream(model_id, 8)  # warm-up
        return statistics.median([(await arm.stream(model_id, args.tokens))[1] for _ in range(args.streams)])
    finally:
        arm.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, type=Path, help="the other checkout (the baseline)")
    ap.add_argument("--after", type=Path, default=REPO, help="default: this checkout")
    ap.add_argument("--model", type=Path, default=None, help="default: the pipeline bench's 110M model")
    ap.add_argument("--segments", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bits", type=int, default=16, choices=(8, 16), help="activation bits on the wire")
    ap.add_argument("--speculation", action="store_true")
    args = ap.parse_args()
    model = args.model or default_model()
    rates: dict[str, list[float]] = {"before": [], "after": []}
    sides = [("before", args.before), ("after", args.after)]
    for r in range(args.rounds):
        for name, repo in sides if r % 2 == 0 else sides[::-1]:
            rates[name].append(await arm_rate(repo, model, args))
        print(f"round {r}: before {rates['before'][-1]:.1f}  after {rates['after'][-1]:.1f} tok/s", flush=True)
    before, after = statistics.median(rates["before"]), statistics.median(rates["after"])
    better = sum(a > b for a, b in zip(rates["after"], rates["before"], strict=True))
    print(f"model={model.name} segments={args.segments} tokens={args.tokens} streams={args.streams} "
          f"threads={args.threads} speculation={'on' if args.speculation else 'off'} cpu={cpu_name()}")
    print(f"decode tok/s median: before {before:.1f}  after {after:.1f}  ratio {after / before:.3f}  "
          f"(after faster in {better} of {args.rounds} pairs)")


if __name__ == "__main__":
    asyncio.run(main())
