"""GGUF tensor names → canonical `LayerWeights`, written once for every family.

Families differ in which of these tensors they carry (fused `attn_qkv` or separate q/k/v, q/k/v
biases, per-head q/k norms, fused `ffn_up` = [gate; up] or separate gate/up) and in their rotary
layout; `read_layer` takes whatever the file holds and brings it to one shape.

The matrices stay lazy (`RowSource`s over the mapped file: splits, head permutations and fusions
are row maps), so a converter reads them a block of rows at a time: loading a slice never holds a
whole layer in float32 (a 1B-shaped layer is 243 MB of it).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from node.errors import ModelLoadError
from node.inference.arch.common import LayerWeights, ModelConfig, neox_row_order, permute_heads
from node.inference.weights.gguf_file import GgufFile
from node.inference.weights.linear import RowSource


def read_layer(f: GgufFile, cfg: ModelConfig, i: int, *, adjacent_pairs: bool) -> LayerWeights:
    """Layer i of `f`; `adjacent_pairs` for llama.cpp's LLAMA_ROPE_TYPE_NORM families."""
    p = f"blk.{i}."
    q, k, v, qb, kb, vb = _qkv(f, cfg, p)
    q_norm = f.f32_or_none(p + "attn_q_norm.weight")
    k_norm = f.f32_or_none(p + "attn_k_norm.weight")
    if adjacent_pairs:
        order = neox_row_order(cfg.head_dim, cfg.rope.n_rot)
        q, k = TakenRows(q, head_rows(cfg.n_heads, order)), TakenRows(k, head_rows(cfg.n_kv_heads, order))
        qb = permute_heads(qb, cfg.n_heads, order) if qb is not None else None
        kb = permute_heads(kb, cfg.n_kv_heads, order) if kb is not None else None
        q_norm = q_norm[order] if q_norm is not None else None
        k_norm = k_norm[order] if k_norm is not None else None
    bias = None
    if qb is not None or kb is not None or vb is not None:
        bias = np.concatenate([_or_zeros(qb, cfg.q_dim), _or_zeros(kb, cfg.kv_dim), _or_zeros(vb, cfg.kv_dim)])
    return LayerWeights(
        attn_norm=f.f32(p + "attn_norm.weight"),
        qkv=StackedRows([q, k, v]),
        qkv_bias=bias,
        q_norm=q_norm,
        k_norm=k_norm,
        out=f.row_source(p + "attn_output.weight"),
        out_bias=f.f32_or_none(p + "attn_output.bias"),
        ffn_norm=f.f32(p + "ffn_norm.weight"),
        gate_up=_gate_up(f, cfg, p),
        down=f.row_source(p + "ffn_down.weight"),
    )


def _qkv(f: GgufFile, cfg: ModelConfig, p: str):
    if f.has(p + "attn_qkv.weight"):
        qkv = f.row_source(p + "attn_qkv.weight")
        if qkv.shape[0] != cfg.q_dim + 2 * cfg.kv_dim:
            raise ModelLoadError(f"{f.path.name}: {p}attn_qkv has {qkv.shape[0]} rows, "
                                 f"expected {cfg.q_dim + 2 * cfg.kv_dim}")
        bounds = [0, cfg.q_dim, cfg.q_dim + cfg.kv_dim, qkv.shape[0]]
        q, k, v = (TakenRows(qkv, np.arange(a, b)) for a, b in pairwise(bounds))
        bias = f.f32_or_none(p + "attn_qkv.bias")
        if bias is None:
            return q, k, v, None, None, None
        qb, kb, vb = np.split(bias, [cfg.q_dim, cfg.q_dim + cfg.kv_dim])
        return q, k, v, qb, kb, vb
    return (
        f.row_source(p + "attn_q.weight"),
        f.row_source(p + "attn_k.weight"),
        f.row_source(p + "attn_v.weight"),
        f.f32_or_none(p + "attn_q.bias"),
        f.f32_or_none(p + "attn_k.bias"),
        f.f32_or_none(p + "attn_v.bias"),
    )


def _gate_up(f: GgufFile, cfg: ModelConfig, p: str) -> RowSource:
    if f.has(p + "ffn_gate.weight"):
        return StackedRows([f.row_source(p + "ffn_gate.weight"), f.row_source(p + "ffn_up.weight")])
    up = f.row_source(p + "ffn_up.weight")  # fused [gate; up] (phi3's gate_up_proj)
    if up.shape[0] != 2 * cfg.ffn:
        raise ModelLoadError(f"{f.path.name}: {p}ffn_up has {up.shape[0]} rows, expected gate+up {2 * cfg.ffn}")
    return up


def _or_zeros(b: np.ndarray | None, n: int) -> np.ndarray:
    return b if b is not None else np.zeros(n, dtype=np.float32)


def head_rows(n_heads: int, order: np.ndarray) -> np.ndarray:
    """The row index that applies a per-head row order to a [n_heads*head_dim, ...] matrix
    (`permute_heads` as an index)."""
    return (np.arange(n_heads)[:, None] * order.shape[0] + order[None, :]).reshape(-1)


class TakenRows:
    """Rows `index` of another source, in that order (a split of a fused tensor, a head
    permutation); a block of them reads the source's span of those rows once."""

    def __init__(self, src: RowSource, index: np.ndarray):
        if index.size and (index.min() < 0 or index.max() >= src.shape[0]):
            raise ValueError(f"row index outside a source of {src.shape[0]} rows")
        self.src, self.index = src, np.asarray(index, dtype=np.int64)
        self.shape = (int(self.index.size), src.shape[1])

    def rows(self, start: int, stop: int) -> np.ndarray:
        idx = self.index[start:stop]
        if idx.size == 0:
            return np.empty((0, self.shape[1]), dtype=np.float32)
        lo, hi = int(idx.min()), int(idx.max()) + 1
        block = self.src.rows(lo, hi)
        if hi - lo == idx.size and np.array_equal(idx, np.arange(lo, hi)):
            return block
        return block[idx - lo]


class StackedRows:
    """Sources one after another, as `np.concatenate` of them would be (a fused [q; k; v] or
    [gate; up] without materialising it)."""

    def __init__(self, parts: list[RowSource]):
        widths = {p.shape[1] for p in parts}
        if len(widths) != 1:
            raise ValueError(f"stacked matrices of different widths {sorted(widths)}")
        self.parts = parts
        self.offsets = np.cumsum([0] + [p.shape[0] for p in parts])
        self.shape = (int(self.offsets[-1]), widths.pop())

    def rows(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        for part, (lo, hi) in zip(self.parts, pairwise(self.offsets), strict=True):
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                pieces.append(part.rows(int(a - lo), int(b - lo)))
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty((0, self.shape[1]), dtype=np.float32)
