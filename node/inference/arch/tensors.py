"""GGUF tensor names → canonical `LayerWeights`, written once for every family.

Families differ in which of these tensors they carry (fused `attn_qkv` or separate q/k/v, q/k/v
biases, per-head q/k norms, fused `ffn_up` = [gate; up] or separate gate/up) and in their rotary
layout; `read_layer` takes whatever the file holds and brings it to one shape.
"""

from __future__ import annotations

import numpy as np

from node.errors import ModelLoadError
from node.inference.arch.common import LayerWeights, ModelConfig, neox_row_order, permute_heads
from node.inference.weights.gguf_file import GgufFile


def read_layer(f: GgufFile, cfg: ModelConfig, i: int, *, adjacent_pairs: bool) -> LayerWeights:
    """Layer i of `f`; `adjacent_pairs` for llama.cpp's LLAMA_ROPE_TYPE_NORM families."""
    p = f"blk.{i}."
    q, k, v, qb, kb, vb = _qkv(f, cfg, p)
    q_norm = f.f32_or_none(p + "attn_q_norm.weight")
    k_norm = f.f32_or_none(p + "attn_k_norm.weight")
    if adjacent_pairs:
        order = neox_row_order(cfg.head_dim, cfg.rope.n_rot)
        q, k = permute_heads(q, cfg.n_heads, order), permute_heads(k, cfg.n_kv_heads, order)
        qb = permute_heads(qb, cfg.n_heads, order) if qb is not None else None
        kb = permute_heads(kb, cfg.n_kv_heads, order) if kb is not None else None
        q_norm = q_norm[order] if q_norm is not None else None
        k_norm = k_norm[order] if k_norm is not None else None
    bias = None
    if qb is not None or kb is not None or vb is not None:
        bias = np.concatenate([_or_zeros(qb, cfg.q_dim), _or_zeros(kb, cfg.kv_dim), _or_zeros(vb, cfg.kv_dim)])
    return LayerWeights(
        attn_norm=f.f32(p + "attn_norm.weight"),
        qkv=np.concatenate([q, k, v]),
        qkv_bias=bias,
        q_norm=q_norm,
        k_norm=k_norm,
        out=f.f32(p + "attn_output.weight"),
        out_bias=f.f32_or_none(p + "attn_output.bias"),
        ffn_norm=f.f32(p + "ffn_norm.weight"),
        gate_up=_gate_up(f, cfg, p),
        down=f.f32(p + "ffn_down.weight"),
    )


def _qkv(f: GgufFile, cfg: ModelConfig, p: str):
    if f.has(p + "attn_qkv.weight"):
        qkv = f.f32(p + "attn_qkv.weight")
        q, k, v = np.split(qkv, [cfg.q_dim, cfg.q_dim + cfg.kv_dim])
        bias = f.f32_or_none(p + "attn_qkv.bias")
        if bias is None:
            return q, k, v, None, None, None
        qb, kb, vb = np.split(bias, [cfg.q_dim, cfg.q_dim + cfg.kv_dim])
        return q, k, v, qb, kb, vb
    return (
        f.f32(p + "attn_q.weight"),
        f.f32(p + "attn_k.weight"),
        f.f32(p + "attn_v.weight"),
        f.f32_or_none(p + "attn_q.bias"),
        f.f32_or_none(p + "attn_k.bias"),
        f.f32_or_none(p + "attn_v.bias"),
    )


def _gate_up(f: GgufFile, cfg: ModelConfig, p: str) -> np.ndarray:
    if f.has(p + "ffn_gate.weight"):
        return np.concatenate([f.f32(p + "ffn_gate.weight"), f.f32(p + "ffn_up.weight")])
    up = f.f32(p + "ffn_up.weight")  # fused [gate; up] (phi3's gate_up_proj)
    if up.shape[0] != 2 * cfg.ffn:
        raise ModelLoadError(f"{f.path.name}: {p}ffn_up has {up.shape[0]} rows, expected gate+up {2 * cfg.ffn}")
    return up


def _or_zeros(b: np.ndarray | None, n: int) -> np.ndarray:
    return b if b is not None else np.zeros(n, dtype=np.float32)
