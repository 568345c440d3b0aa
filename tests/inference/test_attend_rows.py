"""The compiled multi-row attention (`_attend.attend_rows`: a prefill chunk's or a verify step's
rows of one session, causal) against float64 arithmetic, and its invariances: the same bits on
every instruction set, thread count, split of the rows, and on half caches as on float32 caches
holding the same values."""

from __future__ import annotations

import pytest
import torch

from node.inference.arch import block
from node.inference.arch.block import _attend, attention_mask, rows_attention

pytestmark = pytest.mark.skipif(not block._ROWS, reason="the _attend extension (attend_rows) is not built")

# (n_heads, n_kv, head_dim, T, start): GQA 3:1 with rows a 16-lane tile does not fill, a 1B model's
# 5-row verify step (20 rows a head: a full tile and a narrow one), MHA from position 0, head_dims
# no vector width divides, one KV head of 128, more rows and keys than a block (32)
SHAPES = [(12, 4, 64, 60, 100), (32, 8, 64, 5, 300), (4, 4, 16, 3, 0), (6, 2, 24, 17, 5), (8, 1, 128, 40, 70),
          (2, 2, 7, 9, 1), (4, 2, 80, 70, 0)]


def isas() -> list[str]:
    best, found = block._attend_c.isa(), []
    try:
        for name in ("avx512", "avx2", "c"):
            try:
                block._attend_c.set_isa(name)
                found.append(name)
            except ValueError:
                pass
    finally:
        block._attend_c.set_isa(best)
    return found


def case(shape, seed, cap_extra=3):
    nh, nkv, hd, T, start = shape
    g = torch.Generator().manual_seed(seed)
    cap = start + T + cap_extra
    k = torch.randn(nkv, cap, hd, generator=g) * 2
    v = torch.randn(nkv, cap, hd, generator=g)
    k[:, start + T:] = float("nan")  # cells past the last row's position must not be read
    v[:, start + T:] = float("nan")
    qk = torch.randn(T, nh + nkv, hd, generator=g)  # Q heads, then K heads (not read here)
    return qk, k, v


def reference(qk, k, v, start, nh):
    """float64, row by row: softmax(q·kᵀ/√hd) over positions [0, start + t] of the row's KV head."""
    T, _, hd = qk.shape
    group = nh // k.shape[0]
    out = torch.empty(T, nh * hd, dtype=torch.float64)
    kd, vd = k.double(), v.double()
    for t in range(T):
        for h in range(nh):
            s = kd[h // group, : start + t + 1] @ qk[t, h].double() * hd ** -0.5
            out[t, h * hd:(h + 1) * hd] = torch.softmax(s, 0) @ vd[h // group, : start + t + 1]
    return out


def with_isa(name, fn):
    best = block._attend_c.isa()
    block._attend_c.set_isa(name)
    try:
        return fn()
    finally:
        block._attend_c.set_isa(best)


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64(shape):
    nh, nkv, hd, T, start = shape
    qk, k, v = case(shape, sum(shape))
    got = rows_attention(qk, k, v, start, nh)
    want = reference(qk, k, v, start, nh)
    assert got.shape == (T, nh * hd) and torch.isfinite(got).all()
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 5e-6


@pytest.mark.parametrize("shape", SHAPES)
def test_same_bits_on_every_isa_thread_count_and_cache_type(shape):
    """The lanes compute their rows alone in one order: 16 lanes, 8, the portable loop, one thread
    or two; and half caches read exactly, as float32 caches holding the same values."""
    nh, nkv, hd, T, start = shape
    qk, k, v = case(shape, 3)
    k16, v16 = k.half(), v.half()
    want = with_isa("c", lambda: rows_attention(qk, k16.float(), v16.float(), start, nh))
    threads = torch.get_num_threads()
    try:
        for name in isas():
            for n in (1, 2):
                torch.set_num_threads(n)
                for kc, vc in ((k16, v16), (k16.float(), v16.float())):
                    got = with_isa(name, lambda kc=kc, vc=vc: rows_attention(qk, kc, vc, start, nh))
                    assert torch.equal(got, want), (name, n, kc.dtype)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("split", [1, 7, 33])
def test_a_rows_bits_do_not_depend_on_the_rows_with_it(split):
    """70 rows at once, or as two calls (a chunked prefill): every row the same bits."""
    nh, nkv, hd, T, start = 6, 2, 64, 70, 20
    qk, k, v = case((nh, nkv, hd, T, start), 5)
    whole = rows_attention(qk, k, v, start, nh)
    first = rows_attention(qk[:split].contiguous(), k, v, start, nh)
    rest = rows_attention(qk[split:].contiguous(), k, v, start + split, nh)
    assert torch.equal(torch.cat([first, rest]), whole)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_an_infinite_value_past_a_rows_position_leaves_that_row_alone(dtype):
    """A half cache holds inf for a V beyond 65504: a later row's inf must not reach an earlier row
    through its masked keys (0·inf), or a row's result would depend on the rows with it and on how
    a prompt is cut into steps."""
    nh, nkv, hd, T, start = 4, 2, 16, 6, 10
    qk, k, v = case((nh, nkv, hd, T, start), 13)
    k, v = k.to(dtype), v.to(dtype)
    v[0, start + 4, 3] = float("inf")  # position of row 4
    together = rows_attention(qk, k, v, start, nh)
    alone = rows_attention(qk[:1].contiguous(), k, v, start, nh)
    assert torch.isfinite(together[:4]).all() and torch.equal(together[:1], alone)


def test_a_nan_query_gives_nan_in_its_own_row_and_head_only():
    nh, nkv, hd, T, start = 4, 2, 16, 6, 10
    qk, k, v = case((nh, nkv, hd, T, start), 9)
    qk[2, 1, 5] = float("nan")
    out = rows_attention(qk, k, v, start, nh).view(T, nh, hd)
    assert torch.isnan(out[2, 1]).all()
    out[2, 1] = 0.0
    assert torch.isfinite(out).all()


def test_block_attention_takes_it_and_agrees_with_sdpa(monkeypatch):
    """`_attend` (block_forward's attention) on several rows: the compiled kernel, within float32
    rounding of torch's SDPA over the same caches, on float32 and half caches."""
    from types import SimpleNamespace

    nh, nkv, hd, T, start = 12, 4, 64, 24, 50
    cfg = SimpleNamespace(n_heads=nh, n_kv_heads=nkv, head_dim=hd)
    g = torch.Generator().manual_seed(1)
    qk = torch.randn(T, nh + nkv, hd, generator=g)
    qkv = torch.cat([qk, torch.randn(T, nkv, hd, generator=g)], dim=1)
    real, calls = block.rows_attention, []
    monkeypatch.setattr(block, "rows_attention", lambda *a: calls.append(1) or real(*a))
    for dtype in (torch.float32, torch.float16):
        past_k = torch.randn(nkv, start + T + 4, hd, generator=g).to(dtype)
        past_v = torch.randn(nkv, start + T + 4, hd, generator=g).to(dtype)
        calls.clear()
        mask = attention_mask(T, start, nh // nkv, torch.device("cpu"))
        ours = _attend(cfg, qk, qkv, past_k.clone(), past_v.clone(), start, mask)
        monkeypatch.setattr(block, "_ROWS", False)
        sdpa = _attend(cfg, qk, qkv, past_k.clone(), past_v.clone(), start, mask)
        monkeypatch.setattr(block, "_ROWS", True)
        assert calls == [1]
        torch.testing.assert_close(ours, sdpa, rtol=1e-5, atol=2e-6)


def test_bad_arguments_are_refused():
    qk, k, v = case((4, 2, 16, 3, 5), 1)
    out = torch.empty(3, 64)
    f = block._attend_c.attend_rows
    args = (qk.data_ptr(), qk.stride(0), k.data_ptr(), v.data_ptr(), out.data_ptr())
    with pytest.raises(ValueError, match="start \\+ T <= cap"):  # rows past the cache
        f(*args, 3, 9, 4, 2, 16, k.shape[1], 0.25, 1)
    with pytest.raises(ValueError, match="multiple of n_kv"):
        f(*args, 3, 5, 4, 3, 16, k.shape[1], 0.25, 1)
    with pytest.raises(ValueError, match="q_stride"):  # a row stride shorter than the Q heads
        f(qk.data_ptr(), 16, *args[2:], 3, 5, 4, 2, 16, k.shape[1], 0.25, 1)
    with pytest.raises(ValueError, match="start \\+ T <= cap"):  # a start whose sum with T would overflow
        f(*args, 1, 2 ** 63 - 1, 4, 2, 16, k.shape[1], 0.25, 1)
    with pytest.raises(ValueError, match="start \\+ T <= cap"):  # a cap below T (cap - T would wrap)
        f(*args, 1, 0, 4, 2, 16, -2 ** 63, 0.25, 1)
    with pytest.raises(TypeError):
        f(*args)
    with pytest.raises(ValueError, match="caches are"):  # not [n_kv, cap, head_dim]
        rows_attention(qk, k[0], v[0], 5, 4)
    with pytest.raises(ValueError, match="do not fit"):  # a head_dim the caches do not have
        rows_attention(qk[:, :, :8].contiguous(), k, v, 5, 4)
    with pytest.raises(ValueError, match="do not fit"):  # rows past the cache
        rows_attention(qk, k, v, k.shape[1] - 2, 4)
    with pytest.raises(ValueError, match="KV caches"):  # a type the kernels do not read
        rows_attention(qk, k.bfloat16(), v.bfloat16(), 5, 4)
