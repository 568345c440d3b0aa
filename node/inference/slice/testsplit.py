"""`swarmllm test-split MODEL --slices N`: our chained slices against llama.cpp on the same file.

llama.cpp tokenizes the prompt and continues it greedily for --tokens tokens; our engine runs the
model as N chained slices (prefill the prompt, then decode the reference continuation token by
token, teacher-forced) and every position's logits are compared. Prints one line per position and
ends with `max_abs_logit_diff=<x> greedy_match=<k>/<T> slices=<N>`; exits 1 when the difference
exceeds the tolerance or a greedy choice differs (more than 2% of positions), 2 on a load error.

With --dtype f32 on a file with quantized or f16 weights, our linears round their inputs the way
llama.cpp's CPU kernels do (`ggml_emulation`) unless --no-ggml-emulation, so the comparison
isolates the engine rather than llama.cpp's activation rounding.
"""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_PROMPT = 'def read_config(path):\n    """Read the configuration file at path and return'
# tolerance on max |Δlogit| as a fraction of the logit scale (max |reference logit|)
FLOAT_FILE_TOL = 1e-3  # f32 path on F32/F16/BF16 files: float round-off only
QUANT_FILE_TOL = 2e-2  # f32 path on quantized files: rare rounding-boundary flips inside llama.cpp
FAST_TOL = {"bf16": 3e-2, "int8": 5e-2}
MIN_GREEDY_MATCH = 0.98


def add_parser(subparsers) -> None:
    """Register `test-split`."""
    p = subparsers.add_parser("test-split", help="compare N chained torch slices with llama.cpp on one GGUF")
    p.add_argument("model", help="path of a GGUF model file")
    p.add_argument("--slices", type=int, default=2, help="number of chained slices (default 2)")
    p.add_argument("--tokens", type=int, default=32, help="continuation tokens compared (default 32)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text")
    p.add_argument("--dtype", default="f32", choices=["f32", "int8", "bf16"], help="slice weight format")
    p.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1), help="CPU threads")
    p.add_argument("--tolerance", type=float, default=None, help="max |Δlogit| / logit scale allowed")
    p.add_argument("--no-ggml-emulation", action="store_true", help="f32: do not reproduce llama.cpp's rounding")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v, -vv, -vvv (TRACE: per layer)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the comparison; 0 when within tolerance, 1 on mismatch, 2 when it cannot run."""
    import numpy as np
    import torch

    from node.errors import NodeError
    from node.logs import setup_logging

    setup_logging(args.verbose)
    torch.set_num_threads(args.threads)
    try:
        prompt, cont, ref, ours, quantized = _compare(args)
    except (NodeError, OSError, ValueError) as exc:
        print(f"test-split: {exc}", file=sys.stderr)
        return 2
    scale = float(np.abs(ref).max())
    diffs = np.abs(ours - ref).max(axis=1)
    match = 0
    for i, tok in enumerate(cont):
        ours_top, ref_top = int(ours[i].argmax()), int(ref[i].argmax())
        match += ours_top == ref_top
        print(f"pos={len(prompt) + i - 1} token={tok} ref_top={ref_top} ours_top={ours_top} "
              f"max_abs_diff={diffs[i]:.6g}")
    tol = args.tolerance
    if tol is None:
        tol = (QUANT_FILE_TOL if quantized else FLOAT_FILE_TOL) if args.dtype == "f32" else FAST_TOL[args.dtype]
    ok = diffs.max() <= tol * scale and match >= MIN_GREEDY_MATCH * len(cont)
    print(f"{'PASS' if ok else 'FAIL'}: logit_scale={scale:.4g} relative_max_diff={diffs.max() / scale:.3g} "
          f"tolerance={tol:g} dtype={args.dtype} prompt_tokens={len(prompt)}")
    print(f"max_abs_logit_diff={diffs.max():.6g} greedy_match={match}/{len(cont)} slices={args.slices}")
    return 0 if ok else 1


def _compare(args):
    """(prompt ids, continuation ids, reference logits [T, V], our logits [T, V], quantized file?)."""
    import numpy as np
    import torch

    from node.inference.slice.chain import SliceChain
    from node.inference.slice.ggml_emulation import emulate_model
    from node.inference.weights.gguf_file import GgufFile

    f = GgufFile(args.model)
    n_ctx_train = int(f.arch_field("context_length", 2048))
    quantized = any(t.tensor_type.name not in ("F32", "F16", "BF16") for t in f.tensors.values())
    float_weights = all(t.tensor_type.name == "F32" for t in f.tensors.values())
    del f
    # ours first: an unsupported architecture or a bad split is reported in our words
    chain = SliceChain.load(args.model, args.slices, dtype=args.dtype, max_ctx=n_ctx_train)
    if args.dtype == "f32" and not float_weights and not args.no_ggml_emulation:
        for s in chain.slices:
            emulate_model(s)
    from node.inference.llamacpp import load

    llm = load().Llama(args.model, n_ctx=n_ctx_train, n_batch=512, logits_all=True, verbose=False,
                          n_threads=args.threads, type_k=0, type_v=0)
    prompt = llm.tokenize(args.prompt.encode(), add_bos=True)
    if len(prompt) + args.tokens > n_ctx_train:
        raise ValueError(f"prompt ({len(prompt)}) + tokens ({args.tokens}) exceed the context of {n_ctx_train}")
    llm.eval(prompt)
    ref, cont = [], []
    for _ in range(args.tokens):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        ref.append(row)
        cont.append(int(row.argmax()))
        llm.eval([cont[-1]])
    llm.close()
    chain.new_session("test-split")
    rows = [chain.forward("test-split", torch.tensor(prompt), 0, last_only=True, prompt_rows=len(prompt))[0]]
    for i, tok in enumerate(cont[:-1]):
        rows.append(chain.forward("test-split", torch.tensor([tok]), len(prompt) + i, last_only=True,
                                  prompt_rows=0)[0])
    chain.free_session("test-split")
    return prompt, cont, np.stack(ref), torch.stack(rows).numpy(), quantized
