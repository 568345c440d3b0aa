"""Pieces every architecture family shares: config, RMSNorm, RoPE tables, the decoder block.

Conventions (all families are brought to them at load time, so the forward has one shape):
- Q and K rows use the NeoX ("half-split") rotary layout. llama.cpp's `llama` rotates adjacent
  pairs (2i, 2i+1); its loader (`arch/llama.py`) permutes Q/K rows so pair i becomes (i, i+n/2).
  Attention scores are unchanged because Q and K get the same permutation and V none.
- Q, K, V are one fused matrix [q; k; v] and gate/up one fused matrix [gate; up].
- The residual stream is float32 [T, H]; each linear casts as its weight format needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

try:  # built by `pip install` (setup.py) beside qgemm; optional: numpy and torch serve without it
    from node.inference.arch import _attend as _kernels
except ImportError:  # pragma: no cover - depends on the install
    _kernels = None


def row_kernel_takes_threads(fn, n_args: int) -> bool:
    """Whether a row kernel takes the thread count (a build from before it raises TypeError on the
    extra argument; the current one refuses the null pointers with ValueError)."""
    try:
        fn(*([0] * n_args), 0.0, 1)
    except ValueError:
        return True
    except TypeError:
        return False
    return False


if _kernels is not None and not (hasattr(_kernels, "rms_norm_rows") and row_kernel_takes_threads(_kernels.rms_norm_rows, 5)):
    _kernels = None  # pragma: no cover - a build from before the function or its thread count (an
    # editable install not rebuilt after a pull): numpy and torch serve



@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters as llama.cpp derives them from GGUF metadata."""

    n_rot: int  # rotated dims per head (first n_rot of head_dim)
    base: float = 10000.0
    freq_scale: float = 1.0  # 1/factor for linear and yarn scaling
    freq_factors: tuple[float, ...] | None = None  # rope_freqs.weight (llama3 scaling)
    ext_factor: float = 0.0  # yarn extrapolation mix, 0 = off
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of one GGUF model (whole model, not a slice)."""

    arch: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    n_ctx_train: int
    rms_eps: float
    rope: RopeConfig

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


@dataclass
class LayerWeights:
    """One decoder block in canonical float32 form (rows = output features); the matrices are
    numpy arrays or lazy row sources (`weights.linear.RowSource`: `read_layer` gives those)."""

    attn_norm: np.ndarray
    qkv: Any  # [q_dim + 2 kv_dim, H], Q/K rows in NeoX rotary layout
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None  # per-head RMSNorm weights (qwen3), NeoX layout
    k_norm: np.ndarray | None
    out: Any  # [H, q_dim]
    out_bias: np.ndarray | None
    ffn_norm: np.ndarray
    gate_up: Any  # [2 ffn, H]: gate rows then up rows
    down: Any  # [H, ffn]


def neox_row_order(head_dim: int, n_rot: int) -> np.ndarray:
    """Row order that turns an adjacent-pair rotary head into a half-split (NeoX) one."""
    rot = np.concatenate([np.arange(0, n_rot, 2), np.arange(1, n_rot, 2)])
    return np.concatenate([rot, np.arange(n_rot, head_dim)])


def permute_heads(rows: np.ndarray, n_heads: int, order: np.ndarray) -> np.ndarray:
    """Apply a per-head row order to a [n_heads*head_dim, ...] weight or bias."""
    head_dim = order.shape[0]
    shaped = rows.reshape(n_heads, head_dim, *rows.shape[1:])
    return shaped[:, order].reshape(rows.shape)


def rope_cos_sin(rope: RopeConfig, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [n_pos, n_rot/2] (float32), as ggml's rope computes them."""
    half = rope.n_rot // 2
    i = np.arange(half, dtype=np.float64)
    inv = rope.base ** (-2.0 * i / rope.n_rot)
    if rope.freq_factors is not None:
        inv = inv / np.asarray(rope.freq_factors, dtype=np.float64)
    pos = np.arange(n_pos, dtype=np.float64)[:, None]
    extrap = pos * inv[None, :]
    theta = extrap * rope.freq_scale
    mscale = rope.attn_factor
    if rope.ext_factor != 0.0:
        low, high = _yarn_corr_dims(rope)
        ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
        mix = ramp * rope.ext_factor
        theta = theta * (1 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / rope.freq_scale)
    cos = torch.from_numpy((np.cos(theta) * mscale).astype(np.float32))
    sin = torch.from_numpy((np.sin(theta) * mscale).astype(np.float32))
    return cos, sin


def _yarn_corr_dims(rope: RopeConfig) -> tuple[float, float]:
    def corr_dim(n_rot: float) -> float:
        return rope.n_rot * math.log(rope.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(rope.base))

    start = math.floor(corr_dim(rope.beta_fast))
    end = math.ceil(corr_dim(rope.beta_slow))
    return max(0.0, float(start)), min(float(rope.n_rot - 1), float(end))


class RotaryTables:
    """Per-position rotary factors, grown on demand, laid out for `apply_rope`."""

    def __init__(self, rope: RopeConfig, device: torch.device):
        self.rope = rope
        self.device = device
        self.n_pos = 0
        self.cos = self.sin = torch.empty(0)

    def get(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) of shape [count, 1, n_rot] for positions [start, start+count)."""
        end = start + count
        if end > self.n_pos:
            n = max(end, 2 * self.n_pos, 256)
            cos, sin = rope_cos_sin(self.rope, n)
            self.cos = torch.cat([cos, cos], dim=1)[:, None, :].to(self.device)
            self.sin = torch.cat([-sin, sin], dim=1)[:, None, :].to(self.device)
            self.n_pos = n
        return self.cos[start:end], self.sin[start:end]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int) -> torch.Tensor:
    """Half-split rotation of x [T, heads, head_dim] (first n_rot dims); sin carries the sign."""
    if n_rot == x.shape[-1]:
        half = n_rot // 2
        swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
        return torch.addcmul(x * cos, swapped, sin)
    return torch.cat([apply_rope(x[..., :n_rot], cos, sin, n_rot), x[..., n_rot:]], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim (llama.cpp's LLM_NORM_RMS).

    Rows on the CPU ([R, H], or [R, heads, head_dim] for per-head norms) go row by row through the
    compiled kernel (`_attend.rms_norm_rows`, which `_attend.block_decode` uses too; rows over
    threads): a row's bits depend neither on the other rows nor on their number (torch's rms_norm
    gave a lone row other last bits than the same row in a batch), so a decode step alone or
    batched, and a prompt cut into steps of any size, compute the same numbers. Without the kernel
    one row goes through numpy (a BLAS dot and two multiplies: half of torch's cost); the rest
    through torch.
    """
    if _kernels is not None and x.dim() >= 2 and x.shape[0] > 0 and x.numel() > 0 \
            and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and weight.is_contiguous() \
            and weight.shape == (x.shape[-1],):
        # [R, H], or [R, heads, head_dim] (qwen3's Q/K norms, strided views of qkv): every row alone,
        # as block_decode computes them
        x = x.contiguous()
        out = torch.empty_like(x)
        _kernels.rms_norm_rows(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1],
                               x.shape[-1], float(eps), torch.get_num_threads())
        return out
    if x.shape[0] == 1 and x.dim() == 2 and x.device.type == "cpu" and x.dtype == torch.float32 \
            and weight.dtype == torch.float32 and x.is_contiguous():
        a = x.numpy()
        inv = np.float32(1.0 / math.sqrt(float(np.dot(a[0], a[0])) / a.shape[1] + eps))
        out = np.multiply(a, weight.numpy())
        out *= inv
        return torch.from_numpy(out)
    return F.rms_norm(x, weight.shape, weight, eps)
