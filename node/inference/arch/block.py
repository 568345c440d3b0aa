"""The decoder block every supported family shares once its tensors are canonical.

    x = x + out(attention(rope(qk_norm(split(qkv(rms_norm(x)))))))
    x = x + down(silu(gate) * up),  [gate; up] = gate_up(rms_norm(x))

Attention folds the query heads that share a KV head into rows ([n_kv, group*T, hd]) so one
SDPA call serves GQA without repeating K/V, and decode (T = 1) needs no mask at all. A decode
row on the CPU goes to the compiled `_attend.decode` when it is built (torch's fused attention
costs ~40-50 µs of set-up a call for one query: 17 % of a 110M model's decode step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from node.inference.arch.common import (
    LayerWeights,
    ModelConfig,
    apply_rope,
    rms_norm,
    row_kernel_takes_threads,
)
from node.inference.weights.linear import Linear, linear_from_arrays, make_linear
from node.inference.weights.qgemm import Int8Packed

try:
    from node.inference.arch import _attend as _attend_c
except ImportError:  # not built (no C compiler at install): torch's attention for every row
    _attend_c = None
# the fused kernels: absent from a build older than them (an editable install not rebuilt after a pull)
_FUSED = _attend_c is not None and all(hasattr(_attend_c, f) for f in ("rope_decode", "silu_mul_rows", "block_decode")) \
    and row_kernel_takes_threads(_attend_c.silu_mul_rows, 4)  # (a stale build's takes no thread count)
# half KV caches in the compiled kernels (a build from before them: torch's path)
_KV16 = _FUSED and all(hasattr(_attend_c, f) for f in ("decode_kv16", "rope_decode_kv16", "block_decode_kv16"))
_KV_DTYPES = (torch.float32, torch.float16) if _KV16 else (torch.float32,)
# each cache dtype's entry points, looked up once (block_decode and the rest run once a layer a step)
_KV_KERNELS = {dt: {name: getattr(_attend_c, name + ("_kv16" if dt == torch.float16 else ""), None)
                    for name in ("decode", "rope_decode", "block_decode", "attend_rows")}
               for dt in _KV_DTYPES} if _attend_c is not None else {}
# several rows of one session (a prefill chunk, a verify step) in the compiled kernel, reading half
# caches as they are (a build from before it: torch's SDPA)
_ROWS = _attend_c is not None and all(k["attend_rows"] is not None for k in _KV_KERNELS.values())

DOWN_ROTATION = 32  # ffn_down's input rotation block (Hadamard order; 16–64 measured alike)
QKV_PREFILL_RESIDUAL = True  # int8: qkv keeps its residual pass in long prefills (cheap: 1/10 of the compute)


@dataclass
class Block:
    """One decoder block with weights in its device format."""

    attn_norm: torch.Tensor
    qkv: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    out: Linear
    ffn_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    # block_decode's layout (addresses and sizes) with the objects it was made from: made again
    # when one of them was replaced; () = not fusable
    layout: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def build(cls, w: LayerWeights, fmt: str, device: torch.device, *, exact_prefill: bool = False,
              keep: dict[str, np.ndarray] | None = None, kernel: str = "fbgemm") -> Block:
        """Convert canonical numpy weights to `fmt` on `device` (`exact_prefill`: int8 takes the
        residual pass on every matrix in long prefills too, as decode does). `keep` (int8)
        receives every converted array by name, from which `from_arrays` rebuilds the block.
        `kernel`: the int8 kernel (see `make_linear`)."""

        def vec(name: str, a: np.ndarray | None) -> torch.Tensor | None:
            if a is None:
                return None
            a = np.ascontiguousarray(a, dtype=np.float32)
            if keep is not None:
                keep[name] = a
            return torch.from_numpy(a).to(device)

        def lin(name: str, weight, bias: np.ndarray | None) -> Linear:
            sensitive, rotate = _matrix_options(name, exact_prefill)
            parts: dict[str, np.ndarray] | None = {} if keep is not None else None
            linear = make_linear(weight, bias, fmt, device, sensitive=sensitive, rotate=rotate, keep=parts,
                                 kernel=kernel)
            if keep is not None:
                keep.update({f"{name}.{k}": v for k, v in parts.items()})
            return linear

        return cls(attn_norm=vec("attn_norm", w.attn_norm), qkv=lin("qkv", w.qkv, w.qkv_bias),
                   q_norm=vec("q_norm", w.q_norm), k_norm=vec("k_norm", w.k_norm), out=lin("out", w.out, w.out_bias),
                   ffn_norm=vec("ffn_norm", w.ffn_norm), gate_up=lin("gate_up", w.gate_up, None),
                   down=lin("down", w.down, None))

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], fmt: str, device: torch.device, *,
                    exact_prefill: bool = False, kernel: str = "fbgemm") -> Block:
        """The block `build(..., keep=arrays)` made, from those arrays (vectors copied: the arrays
        may be views of one buffer, which the block must not keep alive)."""

        def vec(name: str) -> torch.Tensor | None:
            a = arrays.get(name)
            return None if a is None else torch.from_numpy(np.array(a, dtype=np.float32)).to(device)

        def lin(name: str) -> Linear:
            prefix = name + "."
            parts = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            sensitive, rotate = _matrix_options(name, exact_prefill)
            return linear_from_arrays(parts, fmt, sensitive=sensitive, rotate=rotate, kernel=kernel)

        return cls(attn_norm=vec("attn_norm"), qkv=lin("qkv"), q_norm=vec("q_norm"), k_norm=vec("k_norm"),
                   out=lin("out"), ffn_norm=vec("ffn_norm"), gate_up=lin("gate_up"), down=lin("down"))


def _matrix_options(name: str, exact_prefill: bool) -> tuple[bool, int]:
    """(sensitive, rotate) of one block matrix (see `make_linear`)."""
    if name == "qkv":
        return exact_prefill or QKV_PREFILL_RESIDUAL, 0
    if name == "down":
        # ffn_down's input (silu(gate)·up) is heavy-tailed within each token (on the trained
        # default model a token's largest value is ~10× its rms): a blockwise Hadamard
        # rotation spreads it (~3.8×), which buys long prefills the precision that a
        # residual pass (twice ffn_down's compute) bought before
        return exact_prefill, DOWN_ROTATION
    return exact_prefill, 0


def attention_mask(T: int, start: int, group: int, device: torch.device) -> torch.Tensor | None:
    """Boolean mask [group*T, start+T] for folded rows (row g*T+t sees keys ≤ start+t)."""
    if T == 1:
        return None
    keys = torch.arange(start + T, device=device)
    rows = torch.arange(T, device=device) + start
    mask = keys[None, :] <= rows[:, None]
    return mask.repeat(group, 1)


def block_forward(
    b: Block,
    cfg: ModelConfig,
    x: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    rope: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Run one block on x [T, H] at positions [start, start+T), appending K/V to the caches.

    k_cache, v_cache: [n_kv, capacity, head_dim] with capacity >= start + T.
    """
    return block_forward_many(b, cfg, x, ((k_cache, v_cache, start, x.shape[0], mask),), rope)


def block_forward_many(
    b: Block,
    cfg: ModelConfig,
    x: torch.Tensor,
    parts: tuple[tuple[torch.Tensor, torch.Tensor, int, int, torch.Tensor | None], ...] | list,
    rope: tuple[torch.Tensor, torch.Tensor],
    prompt_rows: tuple[int, ...] | list[int] | None = None,
    rows8: torch.Tensor | None = None,
) -> torch.Tensor:
    """One block on the stacked rows x [R, H] of several sessions (a batched step): every matrix
    runs once over all rows; attention runs per session over its own KV. `parts` lists, in row
    order, each session's (k_cache, v_cache, start, rows, mask); `rope` holds each row's factors.

    `prompt_rows` (per part: how many of its first rows are prompt tokens, the rest generated
    ones; None for a part that does not say) makes each row's numbers independent of its step's
    size and batch on qgemm's slices (SliceModel passes it there only): a prompt row is
    attended in `attend_rows` (split-invariant) and its `prefill8` products may take 8 bits
    (`rows8`, the prompt rows of x); a generated row goes through decode's kernels one row at a
    time (so a verification step's rows are the decode steps' they stand for). Without it, one
    row is decoded and several are attended together (and `rows8`, if given, as the caller marks).
    """
    R = x.shape[0]
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    eps = cfg.rms_eps
    if R == 1 and len(parts) == 1 and not (prompt_rows and prompt_rows[0]) and _fused_decode(parts[0], x, *rope):
        layout = decode_layout(b, cfg)
        if layout:
            return block_decode(layout, cfg, x, parts[0], rope)
    qkv = b.qkv(rms_norm(x, b.attn_norm, eps)).view(R, nh + 2 * nkv, hd)
    if b.q_norm is not None:
        q = rms_norm(qkv[:, :nh], b.q_norm, eps)
        k = rms_norm(qkv[:, nh : nh + nkv], b.k_norm, eps)
        qk = torch.cat([q, k], dim=1)
    else:
        qk = qkv[:, : nh + nkv]
    cos, sin = rope
    o = _attend_parts(cfg, qk, qkv, cos, sin, parts, prompt_rows if prompt_rows is not None else (None,) * len(parts))
    x = x + _mm(b.out, o, rows8)
    return x + b.down(silu_mul(_mm(b.gate_up, rms_norm(x, b.ffn_norm, eps), rows8)))


def _mm(lin: Linear, x: torch.Tensor, rows8: torch.Tensor | None) -> torch.Tensor:
    """lin(x), the prompt rows marked where the kernel takes them (qgemm; the others have one grid)."""
    return lin(x, rows8) if rows8 is not None and isinstance(lin, Int8Packed) else lin(x)


def _attend_parts(cfg: ModelConfig, qk: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  parts, prompt_rows) -> torch.Tensor:
    """Each session's rows of a (batched) step, rotated, appended to its KV and attended. A part
    whose kinds are said: its prompt rows together in attend_rows (the same bits however the
    prompt is cut into steps), then its generated rows one at a time in decode's compiled call
    (the bits of the decode steps they stand for). A part whose kinds are not said (None): a lone
    row in decode's compiled call (the same bits alone or batched), several rows together."""
    outs, row = [], 0
    for part, n_prompt in zip(parts, prompt_rows, strict=True):
        k_cache, v_cache, start, T, mask = part
        if n_prompt is None:
            rows = slice(row, row + T)
            if T == 1 and _fused_decode(part, qk[rows], cos[rows], sin[rows]):
                outs.append(rope_decode_attention(cfg, qk[rows], qkv[rows], cos[rows], sin[rows], k_cache, v_cache,
                                                  start))
            else:
                outs.append(_attend(cfg, apply_rope(qk[rows], cos[rows], sin[rows], cfg.rope.n_rot), qkv[rows],
                                    k_cache, v_cache, start, mask))
            row += T
            continue
        if n_prompt:
            rows = slice(row, row + n_prompt)
            qk_s = apply_rope(qk[rows], cos[rows], sin[rows], cfg.rope.n_rot)
            if n_prompt < T:  # the prompt rows see each other causally, nothing after them
                mask = attention_mask(n_prompt, start, cfg.n_heads // cfg.n_kv_heads, qk.device)
            outs.append(_attend(cfg, qk_s, qkv[rows], k_cache, v_cache, start, mask, rows_kernel=True))
        for i in range(row + n_prompt, row + T):
            one = slice(i, i + 1)
            pos = start + (i - row)
            if _fused_decode((k_cache, v_cache, pos, 1, None), qk[one], cos[one], sin[one]):
                outs.append(rope_decode_attention(cfg, qk[one], qkv[one], cos[one], sin[one], k_cache, v_cache, pos))
            else:
                outs.append(_attend(cfg, apply_rope(qk[one], cos[one], sin[one], cfg.rope.n_rot), qkv[one],
                                    k_cache, v_cache, pos, None))
        row += T
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up of gate_up's output [R, 2f]: CPU float32 rows in the compiled kernel, each row
    alone (as block_decode computes them: the same bits in a step or batch of any size); torch
    otherwise."""
    R, f2 = gu.shape
    if _FUSED and _attend_c is not None and R > 0 and gu.device.type == "cpu" \
            and gu.dtype == torch.float32 and gu.is_contiguous() and f2 > 0:
        out = torch.empty(R, f2 // 2, dtype=torch.float32)
        _attend_c.silu_mul_rows(gu.data_ptr(), out.data_ptr(), R, f2 // 2, 0.0, torch.get_num_threads())
        return out
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def _attend(cfg: ModelConfig, qk: torch.Tensor, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            start: int, mask: torch.Tensor | None, *, rows_kernel: bool = False) -> torch.Tensor:
    """One session's T rows: append their K/V at [start, start+T), attend; [T, n_heads*head_dim].
    `rows_kernel`: a lone row in attend_rows too (a prompt row: the bits it has among others)."""
    T = qk.shape[0]
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    group = nh // nkv
    end = start + T
    k_cache[:, start:end] = qk[:, nh:].transpose(0, 1)
    v_cache[:, start:end] = qkv[:, nh + nkv :].transpose(0, 1)
    if _attend_c is not None and k_cache.device.type == "cpu" and k_cache.dtype == v_cache.dtype \
            and k_cache.dtype in _KV_DTYPES and k_cache.is_contiguous() and v_cache.is_contiguous():
        if T == 1 and mask is None and not (rows_kernel and _ROWS):
            return decode_attention(qk[0, :nh], k_cache, v_cache, end)
        if _ROWS:  # (mask is attention_mask's: causal)
            return rows_attention(qk, k_cache, v_cache, start, nh)
    # heads h = kv*group + g share KV head kv: fold them into rows [1, nkv, group*T, hd]
    # (4-D inputs: torch's fused CPU attention kernel only takes [B, H, L, E])
    if T == 1:
        qf = qk[:, :nh].reshape(1, nkv, group, hd)
    else:
        qf = qk[:, :nh].reshape(T, nkv, group, hd).permute(1, 2, 0, 3).reshape(1, nkv, group * T, hd)
    kc, vc = k_cache[None, :, :end], v_cache[None, :, :end]
    # here only on CUDA, or on the CPU with a build from before attend_rows: half caches are then
    # attended in float32 (a converted copy of [0, end) per layer, which attend_rows does not need)
    if kc.device.type == "cpu" and kc.dtype != torch.float32:
        kc, vc = kc.float(), vc.float()
    # (on CUDA the cache is f16 and the queries go to it; on the CPU these casts are no-ops)
    o = F.scaled_dot_product_attention(qf.to(kc.dtype), kc, vc, attn_mask=mask).float()
    if T == 1:
        return o.reshape(1, nh * hd)
    return o.view(nkv, group, T, hd).permute(2, 0, 1, 3).reshape(T, nh * hd)


def decode_layout(b: Block, cfg: ModelConfig) -> tuple:
    """The block's layout for `_attend.block_decode`: its vectors' and qgemm matrices' addresses and
    its sizes, made once and again whenever one of those objects was replaced (the addresses are
    theirs); () when a part is not in that form."""
    sources = (b.attn_norm, b.ffn_norm, b.q_norm, b.k_norm, b.qkv, b.out, b.gate_up, b.down)
    cached = b.layout
    if cached is None or any(x is not y for x, y in zip(cached[1], sources, strict=True)):
        b.layout = cached = (_layout(b, cfg), sources)
    return cached[0]


def _layout(b: Block, cfg: ModelConfig) -> tuple:
    """() unless every matrix is qgemm's (from a build with the `gemm_c_v1` capsule), every vector a
    contiguous float32 CPU tensor, and every shape the one block_decode computes with."""
    from node.inference.weights import qgemm

    if not _FUSED or getattr(qgemm._qgemm, "gemm_c_v1", None) is None:  # (a build from before it)
        return ()
    mats = (b.qkv, b.out, b.gate_up, b.down)
    if not all(isinstance(m, qgemm.Int8Packed) for m in mats) or (b.q_norm is None) != (b.k_norm is None):
        return ()
    nh, nkv, hd, n_rot = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope.n_rot
    H, f = b.qkv.k, b.down.k
    shapes = ((b.qkv, ((nh + 2 * nkv) * hd, H)), (b.out, (H, nh * hd)), (b.gate_up, (2 * f, H)), (b.down, (H, f)))
    vecs = ((b.attn_norm, H), (b.ffn_norm, H), (b.q_norm, hd), (b.k_norm, hd))
    if any((m.n, m.k) != shape for m, shape in shapes) or not 0 < n_rot <= hd or n_rot % 2 \
            or not all(v is None or (v.device.type == "cpu" and v.dtype == torch.float32 and v.is_contiguous()
                                     and v.shape == (n,)) for v, n in vecs):
        return ()
    ptr = lambda v: 0 if v is None else v.data_ptr()  # noqa: E731
    return (ptr(b.attn_norm), ptr(b.ffn_norm), ptr(b.q_norm), ptr(b.k_norm), *b.qkv.addresses, *b.out.addresses,
            *b.gate_up.addresses, *b.down.addresses, H, nh, nkv, hd, f, n_rot)


def _kv_kernel(name: str, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """`_attend`'s entry point `name` for these caches (its `_kv16` twin for half ones); a dtype
    the kernels do not read (bf16, K and V apart) is refused, never read as another."""
    kernels = _KV_KERNELS.get(k_cache.dtype) if k_cache.dtype == v_cache.dtype else None
    if kernels is None:
        raise ValueError(f"the compiled attention reads float32{' or float16' if _KV16 else ''} KV caches, "
                         f"not K {k_cache.dtype} / V {v_cache.dtype}")
    return kernels[name]


def block_decode(layout: tuple, cfg: ModelConfig, x: torch.Tensor, part, rope) -> torch.Tensor:
    """One session's one-row step through a whole block (`layout`: `decode_layout`'s) in one
    compiled call (`_attend.block_decode`: the unfused path's kernels in its order, so the same
    bits), appending its K/V to the caches."""
    k_cache, v_cache, pos, _, _ = part
    fn = _kv_kernel("block_decode", k_cache, v_cache)
    cos, sin = rope
    if pos >= k_cache.shape[1]:
        raise ValueError(f"position {pos} is past the KV cache's {k_cache.shape[1]} cells")
    y = torch.empty_like(x)
    fn(layout, x.data_ptr(), y.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cos.data_ptr(), sin.data_ptr(),
       k_cache.shape[1], pos, float(cfg.rms_eps), cfg.head_dim ** -0.5, torch.get_num_threads())
    return y


def _fused_decode(part, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether one session's one-row step can take the compiled kernels (`block_decode`, with the
    block's input as `rows`; `rope_decode_attention`, with its Q/K heads): no mask, float32 CPU
    tensors laid out as they read them (the caches float32, or half)."""
    k_cache, v_cache, _, _, mask = part
    return (mask is None and _attend_c is not None and _FUSED and k_cache.device.type == rows.device.type == "cpu"
            and rows.dtype == cos.dtype == sin.dtype == torch.float32 and k_cache.dtype == v_cache.dtype
            and k_cache.dtype in _KV_DTYPES
            and k_cache.is_contiguous() and v_cache.is_contiguous() and rows.is_contiguous() and cos.is_contiguous()
            and sin.is_contiguous() and cos.shape[-1] > 0)


def rope_decode_attention(cfg: ModelConfig, qk: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int) -> torch.Tensor:
    """A decode step's attention in one compiled call: Q and K heads `qk` [1, nh + nkv, hd] rotated
    (as `apply_rope`), K and V (from `qkv`) appended to the caches at `pos`, attention over [0, pos]:
    [1, n_heads*hd], what `apply_rope` + `_attend` give, up to the last bits (no fused multiply-add)."""
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    fn = _kv_kernel("rope_decode", k_cache, v_cache)
    if pos >= k_cache.shape[1]:
        raise ValueError(f"position {pos} is past the KV cache's {k_cache.shape[1]} cells")
    v = qkv[0, nh + nkv:]
    if not v.is_contiguous():
        v = v.contiguous()
    out = torch.empty(1, nh * hd, dtype=torch.float32)
    fn(qk.data_ptr(), v.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
       out.data_ptr(), nh, nkv, hd, cfg.rope.n_rot, k_cache.shape[1], pos, hd ** -0.5, torch.get_num_threads())
    return out


def rows_attention(qk: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, nh: int) -> torch.Tensor:
    """T rows of one session at positions [start, start+T), their K/V already in the caches:
    causal attention in the compiled kernel (`_attend.attend_rows`), Q heads `qk[:, :nh]` (rotated).
    [T, n_heads*hd]; within float32 rounding of SDPA's, each row's bits independent of the rows with
    it, and the same on half caches as on float32 caches holding the same values."""
    T, heads, hd = qk.shape
    if k_cache.dim() != 3:
        raise ValueError(f"rows_attention: caches are [n_kv, cap, head_dim], not {tuple(k_cache.shape)}")
    nkv, cap = k_cache.shape[0], k_cache.shape[1]
    fn = _kv_kernel("attend_rows", k_cache, v_cache)
    if (k_cache.shape != v_cache.shape or k_cache.shape[2] != hd or heads < nh or k_cache.device.type != "cpu"
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or not 0 <= start <= cap - T):
        raise ValueError(f"rows_attention: {T} rows of {heads} heads of {hd} at {start} do not fit caches "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)} (contiguous, CPU)")
    if qk.dtype != torch.float32 or not qk.is_contiguous():
        qk = qk.to(torch.float32).contiguous()
    out = torch.empty(T, nh * hd, dtype=torch.float32)
    fn(qk.data_ptr(), qk.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), T, start, nh, nkv, hd,
       cap, hd ** -0.5, torch.get_num_threads())
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, end: int) -> torch.Tensor:
    """One query row [n_heads, hd] against K/V [n_kv, cap, hd] (float32 or half, CPU, contiguous) over
    positions [0, end) in the compiled kernel: [1, n_heads*hd], as SDPA gives it (scale 1/√hd)."""
    nh, hd = q.shape
    nkv, cap = k_cache.shape[0], k_cache.shape[1]
    fn = _kv_kernel("decode", k_cache, v_cache)
    q = q.to(torch.float32).contiguous()
    out = torch.empty(1, nh * hd, dtype=torch.float32)
    fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), nh, nkv, hd, cap, end, hd ** -0.5,
       torch.get_num_threads())
    return out
