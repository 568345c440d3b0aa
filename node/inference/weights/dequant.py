"""GGML block formats: dequantize what the slice engine loads, quantize what `synth` writes.

Dequantization uses the `gguf` package's vectorized numpy reference code, except Q8_0, which has a
direct path to (int8 values, per-block scales) so the int8 engine can requantize per output
channel without a float32 detour for the whole matrix. Quantization of the K formats (Q4_K, Q5_K,
Q6_K; the `gguf` package only dequantizes those) is a plain min/max fit: not llama.cpp's
error-minimising search, but bit-exact GGML layout, which is all a reference comparison needs
(both engines read the same bits).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as _gq

from node.inference.weights.qgemm import dequant_q8_0

Q = GGMLQuantizationType
SUPPORTED = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
QK_K = 256


def dequantize(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    """float32 array of `shape` (numpy order, last dim contiguous) from a tensor's raw bytes
    (any array whose memory is the GGML data, e.g. uint8 [rows, bytes per row])."""
    if qtype not in SUPPORTED:
        raise ValueError(f"unsupported tensor type {qtype.name}")
    raw = np.asarray(raw)
    if qtype == Q.F32:  # copied: callers own (and may write) what they get
        return np.array(raw.view(np.float32)).reshape(shape)
    if qtype == Q.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if qtype == Q.Q8_0:
        fast = dequant_q8_0(raw.view(np.uint8), shape)  # the compiled loop, on torch's threads
        if fast is not None:
            return fast
        values, scales = q8_0_blocks(raw, shape)
        return (values.reshape(*scales.shape, 32).astype(np.float32) * scales[..., None]).reshape(shape)
    return _gq.dequantize(raw.view(np.uint8), qtype).reshape(shape)


def q8_0_blocks(raw: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 as (int8 values of `shape`, float32 scales of shape[:-1] + (shape[-1] // 32,))."""
    blocks = np.asarray(raw).view(np.uint8).reshape(-1, 34)
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    values = blocks[:, 2:].view(np.int8)
    return values.reshape(shape), scales.reshape(*shape[:-1], shape[-1] // 32)


def quantize(data: np.ndarray, qtype: Q) -> np.ndarray:
    """Raw GGML bytes (uint8, rows × bytes-per-row) of float32 `data` in `qtype`."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        blocks = data.reshape(-1, QK_K)
        fn = {Q.Q4_K: _quantize_q4_k, Q.Q5_K: _quantize_q5_k, Q.Q6_K: _quantize_q6_k}[qtype]
        _, type_size = GGML_QUANT_SIZES[qtype]
        return fn(blocks).reshape(*data.shape[:-1], data.shape[-1] // QK_K * type_size)
    return _gq.quantize(data, qtype)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _minmax_scales(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Per 32-element sub-block affine fit x ≈ d*sc*q - dmin*m with 6-bit sc, m (K-quant style)."""
    sub = x.reshape(x.shape[0], 8, 32)
    lo = np.minimum(sub.min(axis=2), 0.0)
    hi = sub.max(axis=2)
    step = (hi - lo) / levels
    d = step.max(axis=1) / 63.0
    dmin = (-lo).max(axis=1) / 63.0
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.where(d16 > 0, d16, 1)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(-lo / np.where(dmin16 > 0, dmin16, 1)[:, None]), 0, 63).astype(np.uint8)
    scale = d16[:, None] * sc
    offset = dmin16[:, None] * m
    q = np.round((sub + offset[..., None]) / np.where(scale > 0, scale, 1)[..., None])
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(x.shape[0], QK_K)
    return d16, dmin16, sc, m, q


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12-byte 6-bit scale/min packing of Q4_K and Q5_K."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    """128 bytes per block: chunk c holds elements 64c..64c+31 (low) and 64c+32.. (high nibble)."""
    chunks = (q & 0xF).reshape(q.shape[0], 4, 2, 32)
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(q.shape[0], 128)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _minmax_scales(x, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales(sc, m), _low_nibbles(q)], axis=1)


def _quantize_q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _minmax_scales(x, 31)
    high = (q >> 4).reshape(q.shape[0], 8, 32)  # sub-block j's fifth bit goes to bit j of qh[l]
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= high[:, j] << j
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales(sc, m), qh, _low_nibbles(q)], axis=1)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    step = np.abs(sub).max(axis=2) / 31.0
    d = (step.max(axis=1) / 127.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.where(d > 0, d, 1)[:, None]), -128, 127).astype(np.int8)
    scale = d[:, None] * sc
    q = np.round(sub / np.where(scale > 0, scale, 1)[..., None]) + 32
    q = np.clip(q, 0, 63).astype(np.uint8).reshape(n, 2, 4, 32)  # halves of 128, quarters of 32
    ql = np.empty((n, 2, 64), dtype=np.uint8)
    ql[:, :, :32] = (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    return np.concatenate(
        [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1
    )
