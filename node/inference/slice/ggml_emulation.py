"""Reproduce llama.cpp's CPU activation rounding, so a reference comparison isolates our bugs.

llama.cpp does not multiply quantized weights by float32 activations: it first rounds each
activation row to the weight type's "vec_dot" type (Q8_0 blocks of 32 for Q8_0/Q4_0, Q8_K blocks
of 256 for the K formats, f16 for F16, bf16 for BF16). That alone moves logits by ~1% of their
scale on a quantized file. Wrapping the f32 path's linears with the same rounding makes our
logits match llama.cpp's to float32 round-off (measured ~5e-7 relative), which is what
`test-split --dtype f32` and the reference tests check. Diagnostic only: never used for serving.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from node.inference.weights.linear import Linear

_Q8_0_WEIGHTS = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)
_Q8_K_WEIGHTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)


def round_q8_0(x: torch.Tensor) -> torch.Tensor:
    """x rounded as ggml's quantize_row_q8_0 does (blocks of 32, d = amax/127 stored as f16)."""
    a = x.detach().float().cpu().numpy().reshape(-1, 32)
    d = np.abs(a).max(axis=1, keepdims=True) / np.float32(127.0)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(a * inv)
    return torch.from_numpy((q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)).to(x.device)


def round_q8_k(x: torch.Tensor) -> torch.Tensor:
    """x rounded as ggml's quantize_row_q8_K does (blocks of 256, f32 scale)."""
    a = x.detach().float().cpu().numpy().reshape(-1, 256)
    idx = np.abs(a).argmax(axis=1)
    m = a[np.arange(a.shape[0]), idx][:, None]
    safe = np.where(m != 0, m, 1)
    iscale = np.where(m != 0, -127.0 / safe, 0).astype(np.float32)
    q = np.minimum(np.rint(iscale * a), 127)
    out = np.where(iscale != 0, q / np.where(iscale != 0, iscale, 1), 0)
    return torch.from_numpy(out.astype(np.float32).reshape(x.shape)).to(x.device)


def activation_rounding(weight_type: Q) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The rounding llama.cpp applies to activations multiplied by weights of `weight_type`."""
    if weight_type in _Q8_0_WEIGHTS:
        return round_q8_0
    if weight_type in _Q8_K_WEIGHTS:
        return round_q8_k
    if weight_type == Q.F16:
        return lambda x: x.half().float()
    if weight_type == Q.BF16:
        return lambda x: x.bfloat16().float()
    return None


def emulate(linear: Linear, weight_type: Q) -> Linear:
    """`linear` with its input rounded as llama.cpp rounds it for `weight_type` weights."""
    rounding = activation_rounding(weight_type)
    if rounding is None:
        return linear
    return lambda x: linear(rounding(x))


def emulate_model(model) -> None:
    """Wrap every linear of a loaded f32 `SliceModel` with llama.cpp's activation rounding."""
    f = model.file
    for offset, block in enumerate(model.blocks):
        p = f"blk.{model.layer_start + offset}."
        qkv_name = p + "attn_qkv.weight" if f.has(p + "attn_qkv.weight") else p + "attn_q.weight"
        up_name = p + "ffn_up.weight"
        block.qkv = emulate(block.qkv, f.qtype(qkv_name))
        block.out = emulate(block.out, f.qtype(p + "attn_output.weight"))
        block.gate_up = emulate(block.gate_up, f.qtype(up_name))
        block.down = emulate(block.down, f.qtype(p + "ffn_down.weight"))
    if model.head is not None:
        name = "output.weight" if f.has("output.weight") else "token_embd.weight"
        norm, head = model.head
        model.head = (norm, emulate(head, f.qtype(name)))
