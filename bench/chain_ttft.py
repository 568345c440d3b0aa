"""TTFT of cold prompts of several lengths on an N-segment chain (real nodes on 127.0.0.1, int8
slices, bench.concurrency.start_chain): the median and the best of `--reps` prompts per length,
each prompt new (no prefix reuse), one token asked. Shows how a chain's prefill is cut into steps
(`run.prefill_steps`) and overlapped by its segments; run it from two checkouts to compare.

    python -m bench.chain_ttft [--model 110m|1b|default|PATH] [--segments 2] [--threads 1]
                               [--words 40,90,180] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path

import aiohttp

from bench.concurrency import banned, model_path, start_chain
from bench.grammar_engines import cpu_name
from bench.multiturn import ask

WORDS = "the node serves a model to local apps through an api that speaks openai and anthropic".split()


async def main_async(args) -> None:
    path = model_path(args.model, args.cache) if args.model in ("default", "110m", "1b") else Path(args.model)
    bias = banned(path)
    server = await start_chain(path, args.threads, args.segments)
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
            await ask(s, server, [{"role": "user", "content": "warm up"}], 2, bias)
            for n_words in (int(w) for w in args.words.split(",")):
                ttfts, prompt_tokens = [], None
                for i in range(args.reps):  # a new first word each time: nothing to reuse
                    text = f"{i}x{n_words} " + " ".join(WORDS[(j * 7 + i) % len(WORDS)] for j in range(n_words))
                    ttft, _, usage = await ask(s, server, [{"role": "user", "content": text}], 1, bias)
                    ttfts.append(ttft)
                    prompt_tokens = usage.get("prompt_tokens")
                rows.append((prompt_tokens, statistics.median(ttfts), min(ttfts)))
    finally:
        server.stop()
    print(f"model={path.name} segments={args.segments} threads={args.threads} reps={args.reps} cpu={cpu_name()}")
    print(f"{'prompt':>6} {'TTFT median':>11} {'TTFT best':>9}")
    for prompt_tokens, median, best in rows:
        print(f"{prompt_tokens:>6} {median * 1000:>9.1f}ms {best * 1000:>7.1f}ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="110m")
    ap.add_argument("--segments", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--words", default="40,90,180", help="prompt lengths, in words")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "swarmllm-bench")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
