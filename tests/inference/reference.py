"""Helpers shared by the slice-engine tests: llama.cpp reference runs and our chained slices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from node.inference.slice.chain import SliceChain
from node.inference.slice.ggml_emulation import emulate_model
from node.inference.weights import qgemm
from node.inference.weights.linear import fbgemm_available

N_CTX = 512


def llama_model(path, n_ctx: int = N_CTX, kv_dtype: str = "f32"):
    """llama.cpp on the whole file, f32 KV cache (llama.cpp's default f16 cache rounds K/V), or
    with `kv_dtype="f16"` its default one."""
    from node.inference.llamacpp import load

    kv_type = {"f32": 0, "f16": 1}[kv_dtype]  # GGML_TYPE_F32, GGML_TYPE_F16
    return load().Llama(
        str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True, verbose=False,
        n_threads=1, type_k=kv_type, type_v=kv_type, seed=0,
    )


def llama_logits(path, tokens: list[int], kv_dtype: str = "f32") -> np.ndarray:
    """llama.cpp's logits [T, V] for `tokens` evaluated in one batch."""
    m = llama_model(path, kv_dtype=kv_dtype)
    m.eval(tokens)
    out = np.array(m.scores[: len(tokens)], dtype=np.float32)
    m.close()
    return out


def llama_greedy(path, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` (llama.cpp's own argmax over its logits)."""
    return llama_greedy_scored(path, prompt, n)[0]


def llama_greedy_scored(path, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after `prompt`, and llama.cpp's logits [n, V] each was chosen from."""
    m = llama_model(path)
    m.eval(prompt)
    out, rows = [], []
    for _ in range(n):
        row = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        tok = int(np.argmax(row))
        out.append(tok)
        rows.append(row)
        m.eval([tok])
    m.close()
    return out, np.stack(rows)


def first_divergence_is_a_tie(ours: list[int], ref: list[int], ref_logits: np.ndarray, tie: float) -> bool:
    """True when two greedy continuations agree until their first difference (if any), and there
    the reference's logits rank our token within `tie` × its logit scale of its own best: a tie in
    the reference's own arithmetic (its activation rounding is ~1% of the scale), after which the
    two continuations legitimately go their own ways."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            row = ref_logits[i]
            return float(row[b] - row[a]) <= tie * float(np.abs(ref_logits).max())
    return True


# every int8 kernel that can run here: accuracy is asserted on each, not on the one a machine picks
INT8_KERNELS = [k for k, here in (("qgemm", qgemm.available()), ("fbgemm", fbgemm_available())) if here]
needs_fbgemm = pytest.mark.skipif(not fbgemm_available(), reason="no fbgemm in this torch (ARM builds lack it)")


def chain(path, slices: int = 1, dtype: str = "f32", ggml: bool = False, kernel: str | None = None,
          kv_dtype: str = "f32") -> SliceChain:
    """Our model as `slices` chained slices; `ggml` rounds activations as llama.cpp does; `kernel`:
    int8's kernel (None: the one chosen on this machine); `kv_dtype`: the KV caches' (f32 by
    default, as llama_model's reference cache, not the node's f16)."""
    c = SliceChain.load(path, slices, dtype=dtype, max_ctx=N_CTX, kernel=kernel, kv_dtype=kv_dtype)
    if ggml:
        for s in c.slices:
            emulate_model(s)
    return c


def our_logits(c: SliceChain, tokens: list[int], *, decode_from: int | None = None) -> np.ndarray:
    """Our logits [T, V]: one prefill forward, or prefill up to decode_from then one token at a time."""
    c.new_session("t")
    split = len(tokens) if decode_from is None else decode_from
    rows = [c.forward("t", torch.tensor(tokens[:split]), 0, prompt_rows=split)]  # as the node runs them
    for i in range(split, len(tokens)):
        rows.append(c.forward("t", torch.tensor(tokens[i : i + 1]), i, prompt_rows=0))
    c.free_session("t")
    return torch.cat(rows).numpy()


def our_greedy(c: SliceChain, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` with our engine (prefill, then decode with last_only)."""
    c.new_session("g")
    logits = c.forward("g", torch.tensor(prompt), 0, last_only=True, prompt_rows=len(prompt))
    out, pos = [], len(prompt)
    for _ in range(n):
        tok = int(logits[-1].argmax())
        out.append(tok)
        logits = c.forward("g", torch.tensor([tok]), pos, last_only=True, prompt_rows=0)
        pos += 1
    c.free_session("g")
    return out


def relative_max_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |Δlogit| divided by the logit scale (max |logit| of the reference)."""
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def top1_agreement(ours: np.ndarray, ref: np.ndarray, tie: float = 0.0) -> float:
    """Fraction of positions whose argmax agrees with the reference's.

    With `tie` > 0, a position where the reference's two best logits are within `tie` × its logit
    scale is a tie in the reference's own arithmetic: our argmax counts as agreeing when it is one
    of the reference's tokens within that margin of its best.
    """
    ours_top = ours.argmax(axis=1)
    agree = ours_top == ref.argmax(axis=1)
    if tie > 0:
        best = ref.max(axis=1)
        ours_in_ref = ref[np.arange(len(ref)), ours_top]
        agree |= best - ours_in_ref <= tie * float(np.abs(ref).max())
    return float(agree.mean())
