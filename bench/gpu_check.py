"""The slice engine on a GPU (CUDA through torch), in one prepared run: the f16 and bf16 slices'
accuracy against our f32 path on the CPU (the path the suite proves equal to llama.cpp's), and
their speed.

    python bench/gpu_check.py [--device cuda] [--speed-models 110m,1b] [--out DIR]

Accuracy, per model (the embedded default model and the random models of
tests/inference/test_accuracy.py): 128 tokens sampled from the model's own f32 distribution on the
CPU, then their logits from a 2-slice chain on the device, as generation runs (a 16-token prefill,
then one decode step per token) and as one 128-token prefill; printed: perplexity against f32's,
top-1 agreement with f32's logits, the largest logit difference over the logit scale. The bounds
are the CPU formats' (perplexity within 1 %, as test_accuracy holds int8 and bf16 to; top-1 at
least 0.95; every logit finite): the exit status is 1 when one fails.

Speed, per `--speed-models` (synthesized random-weight Q8_0 files: the 110M bench shape, the 1B
one; written to `--cache`): load time, a 128-token prefill in the node's WORK steps and 32 greedy
decode steps (median of `--rounds`), peak device memory. No anchor runs beside it (the PyPI
llama-cpp-python is built for the CPU), so these are figures, not ratios.

On the device machine (a copy of this tree; its python3 holds a CUDA torch, aiohttp and numpy;
the `gguf` package travels as a wheel, see /work/.library/device/README.md):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site:. python3 bench/gpu_check.py --out $OUT

`--device cpu` runs the same on this machine's CPU (a dry run of the script; slow in f16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.concurrency import SHAPES, model_path  # noqa: E402
from node import const  # noqa: E402
from node.inference.slice.chain import SliceChain  # noqa: E402
from node.inference.synth import SynthSpec, write_gguf  # noqa: E402
from node.resources import default_model_path  # noqa: E402
from node.sysinfo import cpu_name  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarmllm" / "slice-bench"
_BASE = SynthSpec(hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=320, n_layers=3)
RANDOM_MODELS = {  # tests/inference/test_accuracy.py's
    "llama-q8_0": _BASE.replace(qtype="Q8_0"),
    "qwen2-q4_k": _BASE.replace(arch="qwen2", qtype="Q4_K"),
    "qwen3-f32": _BASE.replace(arch="qwen3"),
    "phi3-q8_0": _BASE.replace(arch="phi3", n_kv_heads=4, qtype="Q8_0"),
}
PPL_BOUND = 0.01
TOP1_BOUND = 0.95


def logits(c: SliceChain, tokens: list[int], decode_from: int | None) -> np.ndarray:
    """[T, V] float32 on the CPU: one prefill, or a prefill up to decode_from then one token a step."""
    c.new_session("g")
    split = len(tokens) if decode_from is None else decode_from
    rows = [c.forward("g", torch.tensor(tokens[:split]), 0)]
    rows += [c.forward("g", torch.tensor(tokens[i:i + 1]), i) for i in range(split, len(tokens))]
    c.free_session("g")
    return torch.cat([r.float().cpu() for r in rows]).numpy()


def sample(c: SliceChain, n: int, seed: int) -> list[int]:
    """Held-out text for a model: a temperature-1 sample from its own distribution."""
    gen = torch.Generator().manual_seed(seed)
    c.new_session("s")
    tokens = [1]
    out = c.forward("s", torch.tensor(tokens), 0)
    while len(tokens) < n:
        tokens.append(int(torch.multinomial(torch.softmax(out[-1].float().cpu(), dim=-1), 1, generator=gen)))
        out = c.forward("s", torch.tensor(tokens[-1:]), len(tokens) - 1)
    c.free_session("s")
    return tokens


def perplexity(rows: np.ndarray, tokens: list[int]) -> float:
    loss = torch.nn.functional.cross_entropy(torch.from_numpy(rows[:-1]), torch.tensor(tokens[1:]))
    return float(torch.exp(loss))


def accuracy(name: str, path: Path, device: str, dtypes: list[str]) -> list[dict]:
    ref_chain = SliceChain.load(path, 1, dtype="f32", kv_dtype="f32", max_ctx=256)
    tokens = sample(ref_chain, 128, seed=5)
    ref = logits(ref_chain, tokens, None)
    ppl_ref = perplexity(ref, tokens)
    scale = float(np.abs(ref).max())
    rows = []
    for dtype in dtypes:
        c = SliceChain.load(path, 2, dtype=dtype, device=device, max_ctx=256)
        for mode, decode_from in (("generation", 16), ("prefill", None)):
            ours = logits(c, tokens, decode_from)
            finite = bool(np.isfinite(ours).all())
            row = {"model": name, "dtype": dtype, "kv": str(c.first.kv_dtype).removeprefix("torch."), "mode": mode,
                   "ppl_ratio": perplexity(ours, tokens) / ppl_ref - 1 if finite else float("nan"),
                   "top1": float((ours.argmax(1) == ref.argmax(1)).mean()),
                   "max_diff_over_scale": float(np.abs(ours - ref).max() / scale) if finite else float("nan"),
                   "finite": finite}
            row["ok"] = finite and abs(row["ppl_ratio"]) <= PPL_BOUND and row["top1"] >= TOP1_BOUND
            rows.append(row)
            print(f"{name:12} {dtype:5} kv={row['kv']:8} {mode:10} ppl {row['ppl_ratio'] * 100:+7.3f}%  "
                  f"top-1 {row['top1']:.3f}  max|diff|/scale {row['max_diff_over_scale']:.2e}  "
                  f"{'ok' if row['ok'] else 'FAIL'}", flush=True)
        del c
    return rows


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def speed(name: str, path: Path, device: str, dtype: str, rounds: int, prompt: int, decode: int) -> dict:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    c = SliceChain.load(path, 1, dtype=dtype, device=device, max_ctx=prompt + decode + 8)
    sync(device)
    load_s = time.perf_counter() - t0
    vocab = c.first.config.vocab
    tokens = [1] + [int(t) for t in np.random.default_rng(0).integers(min(300, vocab // 4), vocab, prompt - 1)]
    pre, dec = [], []
    for r in range(rounds + 1):  # the first round warms up (kernels, allocator) and is not counted
        c.new_session("b")
        t0 = time.perf_counter()
        for a in range(0, prompt, const.PREFILL_CHUNK_TOKENS):
            out = c.forward("b", torch.tensor(tokens[a:a + const.PREFILL_CHUNK_TOKENS]), a, last_only=True)
        tok = int(out[-1].argmax())
        sync(device)
        t1 = time.perf_counter()
        for i in range(decode):
            tok = int(c.forward("b", torch.tensor([tok]), prompt + i, last_only=True)[-1].argmax())
        sync(device)
        t2 = time.perf_counter()
        c.free_session("b")
        if r:
            pre.append(prompt / (t1 - t0))
            dec.append(decode / (t2 - t1))
    row = {"model": name, "dtype": dtype, "load_s": load_s, "prefill_tok_s": statistics.median(pre),
           "decode_tok_s": statistics.median(dec), "prefill_spread": [min(pre), max(pre)],
           "decode_spread": [min(dec), max(dec)],
           "peak_device_mb": torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None}
    print(f"{name:5} {dtype:5} load {load_s:5.1f} s  prefill {row['prefill_tok_s']:8.1f} tok/s "
          f"[{min(pre):.1f}-{max(pre):.1f}]  decode {row['decode_tok_s']:7.1f} tok/s [{min(dec):.1f}-{max(dec):.1f}]"
          + (f"  peak {row['peak_device_mb']:.0f} MB" if row["peak_device_mb"] is not None else ""), flush=True)
    del c
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--speed-models", default="110m,1b", help="comma list of 110m, 1b; '' for none")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the speed models are written")
    ap.add_argument("--out", type=Path, help="write gpu_check.json here")
    args = ap.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    speed_models = [m for m in args.speed_models.split(",") if m]
    if unknown := [m for m in speed_models if m not in SHAPES]:
        ap.error(f"unknown speed model(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch", torch.__version__, file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}  device {args.device}: {device_name}  cpu: {cpu_name()}", flush=True)
    report: dict = {"torch": torch.__version__, "device": device_name, "cpu": cpu_name(), "accuracy": [], "speed": []}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        models = {"default": default_model_path()}
        for name, spec in RANDOM_MODELS.items():
            models[name] = Path(tmp) / f"{name}.gguf"
            write_gguf(models[name], spec)
        for name, path in models.items():
            report["accuracy"] += accuracy(name, path, args.device, dtypes)
    for name in speed_models:
        path = model_path(name, args.cache)
        for dtype in dtypes:
            report["speed"].append(speed(name, path, args.device, dtype, args.rounds, args.prompt_tokens,
                                         args.decode_tokens))
    failed = [r for r in report["accuracy"] if not r["ok"]]
    print(f"accuracy: {len(report['accuracy']) - len(failed)} of {len(report['accuracy'])} within bounds "
          f"(perplexity within {PPL_BOUND:.0%} of f32, top-1 >= {TOP1_BOUND}, finite)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
