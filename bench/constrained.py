"""Decode speed with and without a JSON-schema constraint, same model: through llama-cpp-python's
`Llama.generate` with the constraint as a logits processor (the node's path before the batch
engine), and through the node's own path now (LlamaEngine's batch engine: the mask is written in
place on llama.cpp's logits row, then llama.cpp's sampler chain samples).

    python -m bench.constrained [--cache DIR] [--tokens N] [--skip-1b]

Models: the default model, and the 1B-shaped Q8_0 random GGUF (node.inference.synth.LLAMA_1B,
written once to --cache, outside the repository: ~1.3 GB). Prints tok/s side by side, the ratio,
and where the constrained run's extra time per token goes (mask fill, logits write, advance).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.grammar_engines import cpu_name
from node.inference import constrain
from node.inference import grammar as g
from node.inference.llamacpp import load
from node.inference.sampling import SamplingParams
from node.inference.tokenizer import ModelTokenizer

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "maxItems": 64, "items": {
    "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "note": {"type": "string", "maxLength": 24}},
    "required": ["id", "note"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}


class Timed:
    """Wraps a TokenConstraint, timing its two calls."""

    def __init__(self, inner):
        self.inner, self.apply_us, self.accept_us = inner, [], []

    def apply(self, logits):
        t0 = time.perf_counter()
        out = self.inner.apply(logits)
        self.apply_us.append((time.perf_counter() - t0) * 1e6)
        return out

    def accept(self, token):
        t0 = time.perf_counter()
        self.inner.accept(token)
        self.accept_us.append((time.perf_counter() - t0) * 1e6)


class Identity:
    """A logits processor that changes nothing: the cost of llama-cpp-python's Python hook alone."""

    def apply(self, logits):
        return logits

    def accept(self, token):
        pass


def run(llm, tok, prompt: list[int], n_tokens: int, constraint) -> tuple[float, int]:
    """(decode tok/s, tokens) of one greedy generation; the first token (prefill) is not counted."""
    processor = None if constraint is None else [lambda _ids, logits: constraint.apply(logits)]
    llm.set_seed(1)
    steps, last, produced = [], None, 0
    for token in llm.generate(prompt, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True,
                              logits_processor=processor):
        now = time.perf_counter()
        if last is not None:
            steps.append(now - last)
        last = now
        produced += 1
        if tok.is_eog(token) or produced >= n_tokens:
            break
        if constraint is not None:
            constraint.accept(token)
    return (len(steps) / sum(steps) if steps else 0.0), produced


def engine_run(path: Path, tok, prompt: list[int], n_tokens: int, threads: int, n_ctx: int,
               params: SamplingParams) -> tuple[float, int]:
    """(decode tok/s, tokens) through the node's own path: LlamaEngine's batch engine, where the
    bias and the grammar mask are written in place on llama.cpp's logits row (no Python sampler)."""
    import asyncio

    from node.inference.handoff import GenerationJob, TokenChannel
    from node.inference.llama_engine import LlamaEngine

    async def go() -> tuple[float, int]:
        engine = LlamaEngine("bench", path, n_ctx=n_ctx, n_threads=threads, max_concurrent=1, kv_cache_seqs=0)
        await engine.async_run(engine.load)
        try:
            stamps: list[float] = []
            for n, keep in ((4, False), (n_tokens, True)):  # warm up, then measure
                channel = TokenChannel(asyncio.get_running_loop())
                job = GenerationJob("bench", list(prompt), params, n)
                done = asyncio.ensure_future(engine.async_generate(job, channel, tok.is_eog, tok))
                async for batch in channel.batches():
                    if keep:
                        stamps += [time.perf_counter()] * len(batch)
                await done
            steps = len(stamps) - 1
            return (steps / (stamps[-1] - stamps[0]) if steps > 0 and stamps[-1] > stamps[0] else 0.0), len(stamps)
        finally:
            await engine.async_run(engine.close)
            engine.shutdown()
    return asyncio.run(go())


def bench(label: str, path: Path, n_tokens: int, threads: int) -> None:
    llama_cpp = load()
    tok = ModelTokenizer(path)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=min(2048, max(256, tok.n_ctx_train or 256)), n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    n_tokens = min(n_tokens, llm.n_ctx() - 32)
    prompt = tok.tokenize("Items as JSON:", add_bos=tok.add_bos)
    params = SamplingParams(grammar=g.json_value(SCHEMA), temperature=0.0)
    t0 = time.perf_counter()
    constrain.check(tok, params)
    setup_ms = (time.perf_counter() - t0) * 1000
    run(llm, tok, prompt, 4, None)  # warm up
    free_tps, free_n = run(llm, tok, prompt, n_tokens, None)
    hook_tps, hook_n = run(llm, tok, prompt, n_tokens, Identity())
    timed = Timed(constrain.constraint_for(tok, params))
    cons_tps, cons_n = run(llm, tok, prompt, n_tokens, timed)
    ratio = cons_tps / free_tps if free_tps else float("nan")
    print(f"\n== {label}: {path.name} (n_vocab={tok.n_vocab}, threads={threads})")
    print(f"  vocabulary + compile (first request) {setup_ms:8.1f} ms")
    print(f"  {'unconstrained':14s} {free_tps:8.1f} tok/s  ({free_n} tokens)")
    print(f"  {'identity hook':14s} {hook_tps:8.1f} tok/s  ({hook_n} tokens)   ratio {hook_tps / free_tps:.3f}")
    print(f"  {'json schema':14s} {cons_tps:8.1f} tok/s  ({cons_n} tokens)   ratio {ratio:.3f} "
          f"({(1 - ratio) * 100:+.1f}% slower)")
    if timed.apply_us:
        print(f"  per token: mask+bias {statistics.fmean(timed.apply_us):7.1f} us (p99 "
              f"{np.percentile(timed.apply_us, 99):.1f}), advance {statistics.fmean(timed.accept_us or [0]):6.1f} us; "
              f"decode step unconstrained {1e6 / free_tps:.0f} us")
    n_ctx = llm.n_ctx()
    llm.close()
    free_e, free_en = engine_run(path, tok, prompt, n_tokens, threads, n_ctx, SamplingParams(temperature=0.0))
    cons_e, cons_en = engine_run(path, tok, prompt, n_tokens, threads, n_ctx, params)
    print(f"  node engine (batch, mask in place on llama.cpp's row): unconstrained {free_e:8.1f} tok/s ({free_en}), "
          f"json schema {cons_e:8.1f} tok/s ({cons_en})   ratio {cons_e / free_e if free_e else float('nan'):.3f}")
    tok.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "swarmllm-bench")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-1b", action="store_true")
    args = ap.parse_args(argv)
    print(f"CPU: {cpu_name()}")
    from node.resources import default_model_path

    if default_model_path().exists():
        bench("default model", default_model_path(), args.tokens, args.threads)
    else:
        print(f"default model MISSING: {default_model_path()}")
    if not args.skip_1b:
        from node.inference.synth import LLAMA_1B, write_gguf

        args.cache.mkdir(parents=True, exist_ok=True)
        path = args.cache / "llama-3.2-1b-shaped-q8_0.gguf"
        if not path.exists():
            print(f"writing {path} (once) ...", flush=True)
            write_gguf(path, LLAMA_1B)
        bench("1B-shaped Q8_0 random", path, args.tokens, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
