"""N-gram speculation (prompt lookup): tokens per round and decode tok/s with and without it, on
text that repeats its context and on prose, same GGUF, same greedy request, one run; on the local
route, or (`--route chain`) over a 3-segment chain of real nodes on 127.0.0.1.

    python -m bench.speculative [--model default|110m|PATH] [--tokens 96] [--threads 2] [--reps 3]
    python -m bench.speculative --route chain [--model 110m] [--slice-dtype auto|f32|int8]

Runs the batch engine (node.inference.llama_engine.LlamaEngine) in this process, one request at a
time: decode tok/s = (tokens - 1) / (last token - first token); tokens per round from the seed-000
summary line (`DIAG: local n-gram speculation complete ... tokens_per_round=`). The texts must be
ones the model continues by copying: the random bench models copy nothing, so the default is the
repository's trained model (resources/models), whose replies quote their context. Greedy text
with speculation is checked equal to the text without it.

The chain arms are two 3-node chains (bench.pipeline_bench.Arm: one `swarmllm run` per third of the
layers), the same except for the coordinator's `speculative_max_draft` (0 and --draft); the client
streams a greedy chat from the coordinator, alternating arms; tokens per round from the
coordinator's `DIAG: pipeline n-gram speculation complete` line. Decode tok/s there is the
client's: (n - 1) / (last content chunk - first).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import time
from pathlib import Path

from bench.concurrency import model_path
from bench.grammar_engines import cpu_name
from node.inference.handoff import GenerationJob, TokenChannel
from node.inference.llama_engine import LlamaEngine
from node.inference.sampling import SamplingParams
from node.inference.tokenizer import ModelTokenizer

CODE = '''def read_config(path, defaults=None):
    """Read a TOML config file and merge it over the defaults."""
    import tomllib
    with open(path, "rb") as f:
        data = tomllib.load(f)
    merged = dict(defaults or {})
    merged.update(data)
    return merged
'''
TEXTS = {
    "repeat": [{"role": "user", "content": "Rewrite this function with the name load_config instead of "
                                           "read_config, changing nothing else:\n\n" + CODE}],
    "prose": [{"role": "user", "content": "Explain in a few sentences what the os.path module is for."}],
}


class _Summary(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "local n-gram speculation complete" in msg:
            self.lines.append(msg)


async def generate(engine: LlamaEngine, tok: ModelTokenizer, prompt: list[int], n: int) -> tuple[list[int], float]:
    job = GenerationJob("bench", list(prompt), SamplingParams(temperature=0.0), n)
    channel = TokenChannel(asyncio.get_running_loop())
    done = asyncio.ensure_future(engine.async_generate(job, channel, tok.is_eog, tok))
    out: list[int] = []
    first = last = 0.0
    async for batch in channel.batches():
        now = time.perf_counter()
        if not out:
            first = now
        out += batch
        last = now
    await done
    return out, (len(out) - 1) / (last - first) if len(out) > 1 and last > first else 0.0


def same(a, b, unit: str = "tokens") -> str:
    """'yes (N tokens)', or where the two greedy outputs (token ids, or the chain arms' texts: the
    client sees text) part: llama.cpp computes a verify step's rows with other kernels than lone
    decode steps, and int8 slices quantize a multi-row step on one activation grid per call, so at
    a near-tie of the top two logits (random models have many) they may legitimately part."""
    if a == b:
        return f"yes ({len(a)} {unit})"
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"same to {unit[:-1]} {i} of {len(a)}, then parts (a near-tie)"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--draft", type=int, default=8, help="speculative_max_draft of the 'on' arm")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "swarmllm-bench")
    ap.add_argument("--route", choices=("local", "chain"), default="local")
    ap.add_argument("--slice-dtype", default="auto", help="the chain's slice weights (auto: int8 on CPU)")
    args = ap.parse_args()
    path = Path(args.model)
    if not await asyncio.to_thread(path.exists):
        path = model_path(args.model, args.cache)
    if args.route == "chain":
        await chain(path, args)
        return
    tok = ModelTokenizer(path)
    summary = _Summary()
    logging.getLogger("node.inference.batch_engine").addHandler(summary)
    logging.getLogger("node.inference.batch_engine").setLevel(logging.DEBUG)
    engines = {}
    for draft in (0, args.draft):
        engines[draft] = LlamaEngine("bench", path, n_ctx=1024, n_threads=args.threads, max_concurrent=1,
                                     speculative_max_draft=draft)
        await engines[draft].async_run(engines[draft].load)
    print(f"model={path.name} cpu={cpu_name()} threads={args.threads} tokens={args.tokens} reps={args.reps} "
          f"(best of reps; arms alternate)")
    print("text    | off tok/s | on tok/s  tokens/round  accepted/drafted | speedup | same greedy text")
    try:
        for name, messages in TEXTS.items():
            prompt = tok.chat_tokens(messages) if tok.chat_template else tok.tokenize(messages[0]["content"])
            rates: dict[int, list[float]] = {0: [], args.draft: []}
            texts: dict[int, list[int]] = {}
            summary.lines.clear()
            for _ in range(args.reps):
                for draft, engine in engines.items():
                    out, rate = await generate(engine, tok, prompt, args.tokens)
                    rates[draft].append(rate)
                    texts.setdefault(draft, out)
                    if texts[draft] != out:
                        raise SystemExit(f"{name}: greedy text changed between repetitions (draft={draft})")
            line = summary.lines[-1] if summary.lines else ""
            tpr = re.search(r"tokens_per_round=([\d.]+)", line)
            acc = re.search(r"drafted=(\d+) accepted=(\d+)", line)
            off, on = max(rates[0]), max(rates[args.draft])
            print(f"{name:7s} | {off:9.1f} | {on:8.1f}  {float(tpr.group(1)) if tpr else 0:12.2f}  "
                  f"{acc.group(2) if acc else 0:>8}/{acc.group(1) if acc else 0:<8} | {on / off:6.2f}x | "
                  f"{same(texts[0], texts[args.draft])}")
    finally:
        for engine in engines.values():
            await engine.async_run(engine.close)
            engine.executor.shutdown(wait=True)
        tok.close()



async def chain(path: Path, args) -> None:
    """The chain arms: speculation off and on at the coordinator of two 3-segment chains."""
    from bench.pipeline_bench import Arm
    from node.models.gguf_meta import read_header

    n_layers = (await asyncio.to_thread(read_header, path)).n_layers
    arms = {draft: Arm(path, n_layers, 3, args.threads, 16, config_toml=f"[inference]\nspeculative_max_draft = {draft}\n",
                       first_args=("-vv",), slice_dtype=args.slice_dtype) for draft in (0, args.draft)}
    try:
        ids = {draft: await arm.ready(path.stem) for draft, arm in arms.items()}
        for draft, arm in arms.items():
            await arm.stream(ids[draft], 4)  # warm-up
        print(f"model={path.name} route=chain segments=3 slices={args.slice_dtype} cpu={cpu_name()} "
              f"threads={args.threads} per node tokens={args.tokens} reps={args.reps} (best of reps; arms alternate)")
        print("text    | off tok/s | on tok/s  tokens/round  accepted/drafted | speedup | same greedy text")
        for name, messages in TEXTS.items():
            rates: dict[int, list[float]] = {d: [] for d in arms}
            texts: dict[int, str] = {}
            changed: list[int] = []
            for _ in range(args.reps):
                for draft, arm in arms.items():
                    _, rate, _ = await arm.stream(ids[draft], args.tokens, messages)
                    rates[draft].append(rate)
                    texts.setdefault(draft, arm.last_text)
                    if texts[draft] != arm.last_text and draft not in changed:
                        changed.append(draft)  # noted once; the first repetition's text is compared
                        print(f"{name}: NOTE greedy text changed between repetitions (draft={draft}; "
                              f"is every node on qgemm? see docs/ARCHITECTURE.md, 'Row kinds')", flush=True)
            log = await asyncio.to_thread((arms[args.draft].dirs[0] / "node.log").read_text, errors="replace")
            line = [ln for ln in log.splitlines() if "pipeline n-gram speculation complete" in ln][-1]
            tpr = re.search(r"tokens_per_round=([\d.]+)", line)
            acc = re.search(r"drafted=(\d+) accepted=(\d+)", line)
            off, on = max(rates[0]), max(rates[args.draft])
            same_text = same(texts[0], texts[args.draft], "chars")
            print(f"{name:7s} | {off:9.1f} | {on:8.1f}  {float(tpr.group(1)):12.2f}  "
                  f"{acc.group(2):>8}/{acc.group(1):<8} | {on / off:6.2f}x | {same_text}")
    finally:
        for arm in arms.values():
            await asyncio.to_thread(arm.stop)


if __name__ == "__main__":
    asyncio.run(main())
