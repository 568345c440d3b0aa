"""A 6-turn chat on the local route (a real node process): TTFT per turn when the node reuses the
previous turn's KV (prefix cache) against the same prompt sent cold (its first message changed, so
nothing is reused), and the cached_tokens the node reports.

    python -m bench.multiturn [--model default|110m|PATH] [--turns 6] [--tokens 24] [--threads 2]
                              [--route local|chain]

Then `--new-conversations` (3) other conversations open with the same system prompt: each first
turn's TTFT against the same prompt cold (on the local route llama.cpp copies the kept sequence's
prefix; on a chain every segment copies it from the kept session, `resume_copy`).

`--route chain`: the same file as a 3-segment chain (bench.concurrency.start_chain: three nodes on
127.0.0.1, int8 slices; `--segments N` for another count), asked through its first node.

`default`: resources/models (256-token context: a short system prompt); `110m`: the random Q8_0
model of bench/concurrency.py (written once to --cache, outside the repository) with a long
system prompt, so the first turn's prefill is what a real chat app's is. Greedy; the
end-of-generation tokens are banned so every reply has --tokens tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.concurrency import banned, model_path, start_chain, start_ours
from bench.grammar_engines import cpu_name

QUESTIONS = ["What does the os module do?", "And os.path?", "How do I list a directory?", "What about hidden files?",
             "How do I join two paths?", "Thanks. Summarise that."]
SYSTEM = ("You are a concise Python documentation assistant. Answer with the function names, their arguments "
          "and one short example. ")


async def ask(session, server, messages, n_tokens: int, bias: dict) -> tuple[float, str, dict]:
    body = {"model": server.model, "messages": messages, "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "logit_bias": bias, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft, text, usage = None, "", {}
    async with session.post(server.base + "/v1/chat/completions", json=body, headers=server.headers) as r:
        if r.status != 200:
            raise SystemExit(f"HTTP {r.status}: {(await r.text())[:300]}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - started
                text += piece
    return (ttft if ttft is not None else time.perf_counter() - started), text, usage


async def main_async(args) -> None:
    path = model_path(args.model, args.cache) if args.model in ("default", "110m", "1b") else Path(args.model)
    n_ctx = 256 if args.model == "default" else args.ctx
    system = SYSTEM if args.model == "default" else SYSTEM * 12
    bias = banned(path)
    if args.route == "chain":
        server = await start_chain(path, args.threads, args.segments)
    else:
        server = await start_ours(path, args.threads, n_ctx, Path(tempfile.mkdtemp(prefix="multiturn-logs-")))
    rows, shared = [], []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
            await ask(session, server, [{"role": "user", "content": "warm up"}], 2, bias)
            messages = [{"role": "system", "content": system}]
            for turn, question in enumerate(QUESTIONS[:args.turns], 1):
                messages.append({"role": "user", "content": question})
                cold = [{"role": "system", "content": f"[{turn}] " + system}, *messages[1:]]
                ttft, text, usage = await ask(session, server, messages, args.tokens, bias)
                cold_ttft, _, _ = await ask(session, server, cold, 1, bias)  # the same length, nothing reused
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                rows.append((turn, usage.get("prompt_tokens"), cached, ttft, cold_ttft))
                messages.append({"role": "assistant", "content": text})
            for i in range(args.new_conversations):
                other = [{"role": "system", "content": system}, {"role": "user", "content": f"New topic {i}: {QUESTIONS[i]}"}]
                cold = [{"role": "system", "content": f"[c{i}] " + system}, other[1]]
                ttft, _, usage = await ask(session, server, other, args.tokens, bias)
                cold_ttft, _, _ = await ask(session, server, cold, 1, bias)
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                shared.append((i + 1, usage.get("prompt_tokens"), cached, ttft, cold_ttft))
    finally:
        server.stop()
    first = rows[0][3]
    route = f"{args.route} segments={args.segments}" if args.route == "chain" else args.route
    print(f"model={args.model} route={route} file={path.name} threads={args.threads} tokens/turn={args.tokens} "
          f"n_ctx={n_ctx} cpu={cpu_name()} load={os.getloadavg()}")
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} {'TTFT':>8} {'cold TTFT':>9} {'TTFT/turn1':>10} {'TTFT/cold':>9}")
    for turn, prompt, cached, ttft, cold in rows:
        print(f"{turn:>4} {prompt:>6} {cached if cached is not None else '-':>6} {ttft * 1000:>6.1f}ms "
              f"{cold * 1000:>7.1f}ms {ttft / first:>10.2f} {ttft / cold:>9.2f}")
    if shared:
        print("new conversations with the same system prompt (first turn each):")
        print(f"{'conv':>4} {'prompt':>6} {'cached':>6} {'TTFT':>8} {'cold TTFT':>9} {'TTFT/cold':>9}")
        for conv, prompt, cached, ttft, cold in shared:
            print(f"{conv:>4} {prompt:>6} {cached if cached is not None else '-':>6} {ttft * 1000:>6.1f}ms "
                  f"{cold * 1000:>7.1f}ms {ttft / cold:>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="110m")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--new-conversations", type=int, default=3, help="then this many opening with the same system prompt")
    ap.add_argument("--route", choices=("local", "chain"), default="local")
    ap.add_argument("--segments", type=int, default=3, help="--route chain: nodes in the chain")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "swarmllm-bench")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
