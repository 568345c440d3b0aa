"""Slice engine vs llama.cpp, side by side on one random-weight Llama-3.2-1B-shaped Q8_0 GGUF.

    python bench/slice_engine.py [--threads 2] [--rounds 5] [--dtype int8] [--profile]

Each engine runs in its own worker process (so each has its own peak RSS) with the whole model
loaded; the parent alternates rounds between them (ours, llama.cpp, ours, ...) so machine noise
lands on both. A round = a fresh 128-token prompt prefill (logits of the last position only, as
generation needs; ours in the node's steps of PREFILL_CHUNK_TOKENS, llama.cpp in its ubatches) +
32 greedy decode steps (`--prompt-tokens`, `--decode-tokens`; `--kv-dtype` the caches of both). Prints per-round figures, then medians with the
min–max spread, the ratios and peak RSS. `--profile` adds a per-stage breakdown of our decode
and prefill (torch profiler, top operators). The model file is written once to a cache dir.

Loads: our first worker starts on an empty weight cache (it converts and writes the cache), a
second one, started after the rounds, loads from it (what a node's restart gets); both loads and
both peak RSS figures are printed. The CPU's model and SIMD flags head the output.

Another CPU's instruction set, emulated on this one (e.g. an AVX2-only machine on an AVX-512
one): `--isa avx2` runs our qgemm and attention kernels on their AVX2 paths and torch's own
kernels at ATEN_CPU_CAPABILITY=avx2 and MKL_ENABLE_INSTRUCTIONS=AVX2 (fbgemm cannot be told, so
the kernel is qgemm), and `--llama-lib DIR`
runs llama.cpp from a libllama built for that set (LLAMA_CPP_LIB_PATH; for AVX2: llama.cpp's
sources from llama-cpp-python's sdist, `cmake -B DIR -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON
-DLLAMA_CURL=OFF && cmake --build DIR --target llama`, then DIR/bin holds the libraries). The
caches, memory and clock stay this machine's: a proxy for the other CPU, said so in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarmllm" / "slice-bench"
VOCAB_LOW = 300  # prompt ids from [VOCAB_LOW, vocab): past the special and byte tokens


def peak_rss_mb() -> float:
    """This process's own peak RSS. Not getrusage's ru_maxrss: Linux carries that across fork and
    exec, so a worker would report the parent's peak (e.g. while it wrote the model file)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:  # not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def model_path(arg: str | None) -> Path:
    """The bench model: --model, or the synthesized 1B-shaped Q8_0 file (written on first use)."""
    if arg:
        return Path(arg)
    from node.inference.synth import LLAMA_1B, write_gguf

    path = CACHE / "llama-3.2-1b-shaped-q8_0.gguf"
    if not path.exists():
        print(f"writing {path} (once; ~1.3 GB) ...", flush=True)
        tmp = path.with_suffix(".tmp")
        write_gguf(tmp, LLAMA_1B)
        tmp.rename(path)
    return path


def prompt_tokens(n: int, seed: int, vocab: int) -> list[int]:
    """A random prompt of `n` ids from the model's vocabulary (the same for both engines)."""
    import numpy as np

    low = min(VOCAB_LOW, vocab // 4)
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(low, vocab, n - 1)]


# --- workers (one process per engine) ---------------------------------------------------------


class Ours:
    def __init__(self, args):
        import torch

        from node.inference.slice import SliceModel

        self.torch = torch
        n_ctx = args.prompt_tokens + args.decode_tokens + 8
        from node.inference.weights.cache import WeightCache

        cache = WeightCache(Path(args.weight_cache), 64 << 30) if args.weight_cache else None
        self.model = SliceModel.load(args.model, dtype=args.dtype, n_threads=args.threads, max_ctx=n_ctx,
                                     cache=cache, sha256=args.sha256, kv_dtype=args.kv_dtype,
                                     kernel=None if args.kernel == "auto" else args.kernel)

    def prefill(self, tokens):
        """In the node's WORK steps of PREFILL_CHUNK_TOKENS (llama.cpp works in ubatches of 512):
        a long prompt's activations are bounded as they are when the node serves it."""
        from node import const

        self.sess = self.model.new_session("bench")
        chunk = const.PREFILL_CHUNK_TOKENS
        for start in range(0, len(tokens), chunk):
            part = tokens[start:start + chunk]
            logits = self.model.forward(self.sess, self.torch.tensor(part), start, last_only=True,
                                        prompt_rows=len(part))  # as the node marks a prompt's steps
        return int(logits[-1].argmax())

    def decode(self, tok, pos):
        logits = self.model.forward(self.sess, self.torch.tensor([tok]), pos, last_only=True, prompt_rows=0)
        return int(logits[-1].argmax())

    def profile(self, tokens, steps):
        from torch.profiler import ProfilerActivity, profile

        out = []
        for name, fn in (("prefill", lambda: self.prefill(tokens)),
                         ("decode", lambda: [self.decode(1, len(tokens) + i) for i in range(steps)])):
            self.prefill(tokens)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            out.append(f"-- our {name} ({'1 x ' + str(len(tokens)) if name == 'prefill' else steps} tokens) --\n"
                       + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        return "\n".join(out)


class Llama:
    def __init__(self, args):
        import numpy as np

        from node.inference.llamacpp import load

        llama_cpp = load()

        self.np = np
        n_ctx = args.prompt_tokens + args.decode_tokens + 8
        kv = args.kv_dtype
        if kv == "auto":  # what ours resolves (f16 unless its build lacks the half kernels)
            from node.inference.arch.block import _KV16
            kv = "f16" if _KV16 else "f32"
        kv_type = 0 if kv == "f32" else 1  # GGML_TYPE_F32 / F16 (llama.cpp's default)
        self.llm = llama_cpp.Llama(str(args.model), n_ctx=n_ctx, n_batch=max(512, n_ctx), n_threads=args.threads,
                                   n_threads_batch=args.threads, verbose=False, type_k=kv_type, type_v=kv_type)

    def prefill(self, tokens):
        self.llm.reset()
        self.llm.eval(tokens)
        return int(self.np.argmax(self.llm.scores[self.llm.n_tokens - 1]))

    def decode(self, tok, pos):
        self.llm.eval([tok])
        return int(self.np.argmax(self.llm.scores[self.llm.n_tokens - 1]))


def set_isa(isa: str) -> None:
    """qgemm and the attention kernels (for "avx2" or "c": `_attend`'s rows kernel has an AVX-512
    path of its own) on `isa`'s path; ValueError when this CPU lacks it."""
    from node.inference.weights import qgemm

    if not qgemm.available():
        raise ValueError("qgemm is not built here")
    qgemm._qgemm.set_isa(isa)
    if isa in ("avx2", "c"):
        from node.inference.arch import block

        if block._attend_c is not None:
            block._attend_c.set_isa(isa)


def worker(args) -> None:
    if args.worker == "ours":  # imports are the process's start, not the model's load
        import node.inference.slice  # noqa: F401

        if args.isa:
            set_isa(args.isa)
    else:
        from node.inference.llamacpp import load

        load()
    t0 = time.perf_counter()
    engine = (Ours if args.worker == "ours" else Llama)(args)
    from node.models.gguf_meta import read_header

    vocab = read_header(args.model).vocab_size
    reply = {"load_s": time.perf_counter() - t0,
             "weight_cache": getattr(getattr(engine, "model", None), "weight_cache", None),
             "kernel": getattr(getattr(engine, "model", None), "kernel", "llama.cpp")}
    if args.worker == "llama":  # which of its CPU features the llama.cpp build in use has
        from node.inference.llamacpp import load

        info = load().llama_print_system_info()
        reply["system_info"] = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
    else:
        import torch

        from node.inference.arch import block
        from node.inference.weights import qgemm

        attend = block._attend_c.isa() if block._attend_c is not None else "none"
        reply["system_info"] = (f"qgemm isa={qgemm.isa()}, attention isa={attend}, "
                                f"torch kernels {torch.backends.cpu.get_cpu_capability()}")

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "round":
            tokens = prompt_tokens(args.prompt_tokens, cmd["seed"], vocab)
            t = time.perf_counter()
            tok = engine.prefill(tokens)
            prefill_s = time.perf_counter() - t
            t = time.perf_counter()
            for i in range(args.decode_tokens):
                tok = engine.decode(tok, len(tokens) + i)
            reply = {"prefill_s": prefill_s, "decode_s": time.perf_counter() - t, **reply}
        elif cmd["op"] == "ping":  # loaded: the load's figures go back with this reply
            pass
        elif cmd["op"] == "profile":
            reply = {"text": engine.profile(prompt_tokens(args.prompt_tokens, 0, vocab), 8)}
        elif cmd["op"] == "quit":
            reply = {"peak_rss_mb": peak_rss_mb()}
        print(json.dumps(reply), flush=True)
        reply = {}
        if cmd["op"] == "quit":
            return


# --- parent -------------------------------------------------------------------------------------


class Worker:
    def __init__(self, kind: str, args, kernel: str = "auto"):
        argv = [sys.executable, __file__, "--worker", kind, "--kernel", kernel, "--model", str(args.model),
                "--threads", str(args.threads), "--dtype", args.dtype, "--kv-dtype", args.kv_dtype,
                "--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens)]
        env = dict(os.environ)
        if kind == "ours" and args.weight_cache:
            argv += ["--weight-cache", str(args.weight_cache), "--sha256", args.sha256]
        if kind == "ours" and args.isa:
            argv += ["--isa", args.isa]
            if args.isa in ("avx2", "avx512"):  # torch's own kernels (norms, attention, elementwise)
                env["ATEN_CPU_CAPABILITY"] = "avx2" if args.isa == "avx2" else "avx512"
                if args.isa == "avx2":  # and MKL's, which dispatch on their own
                    env["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
            elif args.isa == "c":
                env["ATEN_CPU_CAPABILITY"] = "default"
        if kind == "llama" and args.llama_lib:
            env["LLAMA_CPP_LIB_PATH"] = str(args.llama_lib)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     stderr=subprocess.DEVNULL if kind == "llama" else None)
        self.loaded = self.ask(op="ping")  # one engine loads at a time: no load runs beside a round

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("bench worker died")
        return json.loads(line)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f}  [{min(values):.1f}–{max(values):.1f}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="GGUF to run (default: synthesized 1B-shaped Q8_0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dtype", default="int8", choices=["int8", "bf16", "f32"])
    p.add_argument("--kv-dtype", default="auto", choices=["auto", "f16", "f32"],
                   help="KV caches on both engines (auto: ours f16 where its kernels read it, llama.cpp f16)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--profile", action="store_true", help="print our per-operator breakdown")
    p.add_argument("--weight-cache", default=str(CACHE / "weight-cache"),
                   help="our converted-weight cache dir (emptied first; '' = none)")
    p.add_argument("--kernel", default="auto", choices=["auto", "qgemm", "fbgemm", "both"],
                   help="our int8 kernel (auto: the one measured fastest here; both: side by side)")
    p.add_argument("--isa", default="", choices=["", "avx512", "avx2", "c"],
                   help="run our qgemm (and torch's kernels) on this instruction set's path (emulation)")
    p.add_argument("--llama-lib", default="", help="a directory with the libllama to run llama.cpp from")
    p.add_argument("--sha256", default="", help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=["ours", "llama"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.isa:  # checked before the model is written
        if args.kernel not in ("auto", "qgemm"):
            p.error("--isa forces qgemm's path: fbgemm has no such switch")
        if args.dtype != "int8":
            p.error("--isa emulates the int8 path only (bf16/f32 run torch's MKL/oneDNN matmuls)")
        try:
            set_isa(args.isa)
        except ValueError as e:
            p.error(f"--isa {args.isa}: {e}")
        args.kernel = "qgemm"
    if args.llama_lib and not any(Path(args.llama_lib).glob("*llama.*")):
        p.error(f"--llama-lib {args.llama_lib}: no libllama there (the build's bin/ or lib/ directory)")
    args.model = model_path(args.model)
    from node.sysinfo import cpu_features, cpu_name

    print(f"cpu: {cpu_name()} ({' '.join(cpu_features()) or 'no SIMD flags read'}), "
          f"{os.cpu_count()} logical cpus")
    if args.isa or args.llama_lib:
        print(f"EMULATION: ours on the {args.isa or 'native'} path, llama.cpp from "
              f"{args.llama_lib or 'its native build'} (caches, memory and clock are this CPU's)")
    if args.weight_cache:
        import shutil

        from node.models.catalog import sha256_file

        shutil.rmtree(args.weight_cache, ignore_errors=True)
        args.sha256 = sha256_file(args.model)
    print(f"model {args.model.name} ({args.model.stat().st_size / 1e9:.2f} GB), threads={args.threads}, "
          f"dtype={args.dtype}, kv={args.kv_dtype}, prompt={args.prompt_tokens}, decode={args.decode_tokens}, rounds={args.rounds}")
    kernels = ["qgemm", "fbgemm"] if args.kernel == "both" else [args.kernel]
    ours_names = [f"ours {k}" if args.kernel == "both" else "ours" for k in kernels]
    workers = {name: Worker("ours", args, k) for name, k in zip(ours_names, kernels, strict=True)}
    workers["llama.cpp"] = Worker("llama", args)
    for name, w in workers.items():
        print(f"{name}: {w.loaded['system_info'].strip()}")
    results: dict[str, list[dict]] = {k: [] for k in workers}
    for r in range(args.rounds):
        for name, w in workers.items():
            res = w.ask(op="round", seed=r)
            results[name].append(res)
            print(f"round {r} {name:12s} prefill {args.prompt_tokens / res['prefill_s']:7.1f} tok/s  "
                  f"decode {args.decode_tokens / res['decode_s']:6.2f} tok/s "
                  f"({res['decode_s'] / args.decode_tokens * 1000:.1f} ms/tok)", flush=True)
    if args.profile:
        for name in ours_names:
            print(name, workers[name].ask(op="profile")["text"])
    summary = {}
    for name, w in workers.items():
        rounds = results[name]
        summary[name] = {
            "prefill": [args.prompt_tokens / x["prefill_s"] for x in rounds],
            "decode": [args.decode_tokens / x["decode_s"] for x in rounds],
            "load_s": w.loaded["load_s"],
            "weight_cache": w.loaded["weight_cache"],
            "kernel": w.loaded["kernel"],
            **w.ask(op="quit"),
        }
    print(f"\n{'engine':12s} {'kernel':9s} {'decode tok/s (median [min–max])':34s} {'prefill tok/s':30s} peak RSS   load")
    for name, s in summary.items():
        print(f"{name:12s} {s['kernel']:9s} {spread(s['decode']):34s} {spread(s['prefill']):30s} "
              f"{s['peak_rss_mb']:6.0f} MB  {s['load_s']:.1f} s")
    ref = summary["llama.cpp"]
    for name, kernel in zip(ours_names, kernels, strict=True):
        ours = summary[name]
        if args.weight_cache:
            again = Worker("ours", args, kernel)
            second = {**again.loaded, **again.ask(op="round", seed=0), **again.ask(op="quit")}
            print(f"{name} loads: first {ours['load_s']:.1f} s (weight cache {ours['weight_cache']}, target <= 10 s), "
                  f"second {second['load_s']:.1f} s (weight cache {second['weight_cache']}, target <= 3 s); "
                  f"peak RSS first {ours['peak_rss_mb']:.0f} MB, second {second['peak_rss_mb']:.0f} MB = "
                  f"{second['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x llama.cpp's (target <= 1.1x)")
        d = statistics.median(ours["decode"]) / statistics.median(ref["decode"])
        pf = statistics.median(ours["prefill"]) / statistics.median(ref["prefill"])
        per_round_d = [a / b for a, b in zip(ours["decode"], ref["decode"], strict=True)]
        per_round_p = [a / b for a, b in zip(ours["prefill"], ref["prefill"], strict=True)]
        print(f"ratio {name} ({ours['kernel']})/llama.cpp: decode {d:.2f}x (per round {min(per_round_d):.2f}–"
              f"{max(per_round_d):.2f}; target >= 1.2x), prefill {pf:.2f}x (per round {min(per_round_p):.2f}–"
              f"{max(per_round_p):.2f}; target >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
