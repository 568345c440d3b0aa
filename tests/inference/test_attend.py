"""The compiled decode attention (`node/inference/arch/_attend.c`) against torch's SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from node.inference.arch import block
from node.inference.arch.block import decode_attention

pytestmark = pytest.mark.skipif(block._attend_c is None, reason="the _attend extension is not built")

# (n_heads, n_kv, head_dim, cap, end): MHA, GQA 4:1 and 8:1, a head_dim that is not a multiple of 8
# (the scalar tail), one position, a long context (the threaded path), end == cap
SHAPES = [(12, 12, 64, 168, 140), (32, 8, 64, 64, 1), (8, 1, 128, 2048, 1500), (6, 2, 20, 40, 40),
          (4, 4, 7, 9, 5), (16, 4, 80, 512, 333)]


def sdpa(q, k, v, end):
    nh, hd = q.shape
    nkv = k.shape[0]
    o = F.scaled_dot_product_attention(q.reshape(1, nkv, nh // nkv, hd), k[None, :, :end], v[None, :, :end])
    return o.reshape(1, nh * hd)


def rand(nh, nkv, hd, cap, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(nh, hd, generator=g), torch.randn(nkv, cap, hd, generator=g) * 2,
            torch.randn(nkv, cap, hd, generator=g))


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_sdpa(shape):
    nh, nkv, hd, cap, end = shape
    q, k, v = rand(nh, nkv, hd, cap, sum(shape))
    k[:, end:] = float("nan")  # positions past `end` must not be read
    v[:, end:] = float("nan")
    got = decode_attention(q, k, v, end)
    want = sdpa(q, k, v, end)
    assert got.shape == want.shape == (1, nh * hd)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_portable_loop_gives_the_same_bits(shape):
    nh, nkv, hd, cap, end = shape
    q, k, v = rand(nh, nkv, hd, cap, 7)
    best = block._attend_c.isa()
    fast = decode_attention(q, k, v, end)
    block._attend_c.set_isa("c")
    try:
        portable = decode_attention(q, k, v, end)
    finally:
        block._attend_c.set_isa(best)
    assert block._attend_c.isa() == best
    assert torch.equal(fast, portable)


def test_threads_do_not_change_the_result():
    q, k, v = rand(8, 1, 128, 2048, 3)
    threads = torch.get_num_threads()
    one = two = None
    try:
        torch.set_num_threads(1)
        one = decode_attention(q, k, v, 1500)
        torch.set_num_threads(2)
        two = decode_attention(q, k, v, 1500)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_a_nan_query_gives_nan_rows_of_its_own_head_only():
    q, k, v = rand(4, 2, 16, 32, 5)
    q[1, 3] = float("nan")
    out = decode_attention(q, k, v, 20).view(4, 16)
    assert torch.isnan(out[1]).all()
    assert torch.isfinite(out[[0, 2, 3]]).all()


def test_bad_shapes_are_refused():
    q, k, v = rand(4, 2, 16, 32, 1)
    out = torch.empty(1, 64)
    with pytest.raises(ValueError, match="0 < end <= cap"):
        block._attend_c.decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 4, 2, 16, 32, 33, 0.25, 1)
    with pytest.raises(ValueError, match="multiple of n_kv"):
        block._attend_c.decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 4, 3, 16, 32, 8, 0.25, 1)
    with pytest.raises(TypeError):
        block._attend_c.decode(q.data_ptr(), k.data_ptr())
    with pytest.raises(ValueError, match="2\\^30"):  # a cap whose index math would overflow
        block._attend_c.decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 4, 2, 16, 1 << 31, 8, 0.25, 1)
    best = block._attend_c.isa()
    block._attend_c.set_isa("c")
    try:
        with pytest.raises(ValueError, match="not available"):
            block._attend_c.set_isa("avx1024")
        assert block._attend_c.isa() == "c"  # a refused name changes nothing
    finally:
        block._attend_c.set_isa(best)


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("n_rot", [8, 4])
def test_block_decode_step_equals_the_sdpa_path(monkeypatch, qk_norm, n_rot):
    """A whole block's decode step through the kernels (rope_decode) equals the same step through
    apply_rope and SDPA: full and partial rotation, with and without Q/K norms (qwen3)."""
    import numpy as np

    from node.inference.arch.common import LayerWeights, ModelConfig, RopeConfig, RotaryTables

    cfg = ModelConfig(arch="llama", n_layers=1, hidden=64, n_heads=8, n_kv_heads=2, head_dim=8, ffn=96, vocab=50,
                      n_ctx_train=64, rms_eps=1e-5, rope=RopeConfig(n_rot=n_rot, base=10000.0))
    rng = np.random.default_rng(0)

    def m(r, c):
        return (rng.standard_normal((r, c)) * 0.2).astype(np.float32)

    norm = (lambda: (1 + rng.standard_normal(8) * 0.1).astype(np.float32)) if qk_norm else (lambda: None)
    w = LayerWeights(attn_norm=np.ones(64, np.float32), qkv=m(8 * 8 + 2 * 2 * 8, 64), qkv_bias=None, q_norm=norm(),
                     k_norm=norm(), out=m(64, 64), out_bias=None, ffn_norm=np.ones(64, np.float32), gate_up=m(2 * 96, 64),
                     down=m(64, 96))
    fused, real = [], block.rope_decode_attention
    monkeypatch.setattr(block, "rope_decode_attention", lambda *a: fused.append(1) or real(*a))
    b = block.Block.build(w, "f32", torch.device("cpu"))
    rotary = RotaryTables(cfg.rope, torch.device("cpu"))
    x = torch.randn(11, 64, generator=torch.Generator().manual_seed(1))

    def run():
        k, v = torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)
        block.block_forward(b, cfg, x[:10], k, v, 0, rotary.get(0, 10), block.attention_mask(10, 0, 4, torch.device("cpu")))
        return block.block_forward(b, cfg, x[10:], k, v, 10, rotary.get(10, 1), None)

    with torch.inference_mode():
        fast = run()
        assert fused == [1]  # the decode step (not the 10-row prefill) took the compiled path
        monkeypatch.setattr(block, "_attend_c", None)
        slow = run()
    assert fused == [1]
    assert float((fast - slow).abs().max()) <= 1e-5 * float(slow.abs().max())  # float32 rounding only


# (n_heads, n_kv, head_dim, n_rot, cap, pos): full and partial rotation, GQA, the first position, the last cell
ROPE_SHAPES = [(12, 4, 64, 64, 168, 139), (8, 8, 16, 8, 32, 0), (6, 2, 20, 12, 40, 39), (32, 8, 128, 128, 1024, 700)]


@pytest.mark.parametrize("shape", ROPE_SHAPES)
def test_rope_decode_equals_rotation_then_attention(shape):
    """The fused step (rotation, cache append at pos, attention over [0, pos]) against apply_rope,
    the cache writes and decode_attention done apart; cells other than pos are left as they were."""
    from node.inference.arch.common import apply_rope

    nh, nkv, hd, n_rot, cap, pos = shape
    g = torch.Generator().manual_seed(sum(shape))
    qk = torch.randn(1, nh + nkv, hd, generator=g)
    vrow = torch.randn(nkv, hd, generator=g)
    theta = torch.rand(n_rot // 2, generator=g) * 6
    cos = torch.cat([theta.cos(), theta.cos()])[None, None, :].contiguous()
    sin = torch.cat([-theta.sin(), theta.sin()])[None, None, :].contiguous()
    k = torch.randn(nkv, cap, hd, generator=g)
    v = torch.randn(nkv, cap, hd, generator=g)
    k[:, pos + 1:] = float("nan")  # past pos: never read, never written
    v[:, pos + 1:] = float("nan")
    k_ref, v_ref = k.clone(), v.clone()
    rot = apply_rope(qk, cos, sin, n_rot)
    k_ref[:, pos] = rot[0, nh:]
    v_ref[:, pos] = vrow
    want = decode_attention(rot[0, :nh], k_ref, v_ref, pos + 1)
    out = torch.empty(1, nh * hd)
    block._attend_c.rope_decode(qk.data_ptr(), vrow.data_ptr(), cos.data_ptr(), sin.data_ptr(), k.data_ptr(),
                                v.data_ptr(), out.data_ptr(), nh, nkv, hd, n_rot, cap, pos, hd ** -0.5, 2)
    scale = float(rot.abs().max())
    torch.testing.assert_close(k[:, pos], k_ref[:, pos], rtol=0, atol=1e-6 * scale)  # (x·cos + s·sin, with or
    assert torch.equal(v[:, pos], vrow)                                               # without a fused add)
    assert torch.equal(k[:, :pos], k_ref[:, :pos]) and torch.equal(v[:, :pos], v_ref[:, :pos])
    assert torch.isnan(k[:, pos + 1:]).all() and torch.isnan(v[:, pos + 1:]).all()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6)


def test_rope_decode_refuses_bad_arguments():
    qk, vrow, out = torch.zeros(6, 16), torch.zeros(2, 16), torch.empty(1, 64)
    cos = sin = torch.ones(16)
    k = v = torch.zeros(2, 8, 16)
    args = [qk.data_ptr(), vrow.data_ptr(), cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()]
    with pytest.raises(ValueError, match="pos < cap"):
        block._attend_c.rope_decode(*args, 4, 2, 16, 16, 8, 8, 0.25, 1)  # pos == cap: no cell to append to
    with pytest.raises(ValueError, match="even"):
        block._attend_c.rope_decode(*args, 4, 2, 16, 17, 8, 0, 0.25, 1)
    with pytest.raises(ValueError, match="null pointer"):
        block._attend_c.rope_decode(0, *args[1:], 4, 2, 16, 16, 8, 0, 0.25, 1)
    with pytest.raises(TypeError):
        block._attend_c.rope_decode(*args)


@pytest.mark.parametrize("spread", [30.0, 300.0])
def test_peaked_scores_exp_underflow_and_both_paths_agree(spread):
    """Scores hundreds apart (most probabilities underflow: the exp's cut-off below -87.3, deep
    negative arguments): as close to float64 attention as torch's float32 SDPA gets, and the AVX2
    lanes equal the portable loop bit for bit."""
    g = torch.Generator().manual_seed(int(spread))
    q = torch.randn(12, 64, generator=g) * spread
    k, v = torch.randn(4, 600, 64, generator=g), torch.randn(4, 600, 64, generator=g)
    got = decode_attention(q, k, v, 550)
    ref = F.scaled_dot_product_attention(q.double().reshape(1, 4, 3, 64), k.double()[None, :, :550],
                                         v.double()[None, :, :550]).reshape(1, -1)
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=5e-5)
    best = block._attend_c.isa()
    block._attend_c.set_isa("c")
    try:
        assert torch.equal(decode_attention(q, k, v, 550), got)
    finally:
        block._attend_c.set_isa(best)


# --- half (f16) KV caches ---------------------------------------------------------------------

kv16 = pytest.mark.skipif(not block._KV16, reason="the _attend build has no half-cache kernels")


@kv16
def test_half_rounding_is_torchs_bit_for_bit():
    """The caches' float32 -> half rounding (the C kernels' writes) against torch's float16
    assignment (prefill's writes): random bit patterns, the half range densely, and the edges
    (overflow to inf at 65520, subnormals, ties to even, signed zeros)."""
    g = torch.Generator().manual_seed(0)
    anywhere = torch.randint(-2**31, 2**31, (1_000_000,), generator=g, dtype=torch.int64).to(torch.int32)
    exp = torch.randint(95, 150, (1_000_000,), generator=g, dtype=torch.int32)
    mant = torch.randint(0, 2**23, (1_000_000,), generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (1_000_000,), generator=g, dtype=torch.int32) << 31
    dense = sign | (exp << 23) | mant
    edges = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                          2.0**-14, 2.0**-14 * (1 - 2**-11), 1 + 2**-11, 1 + 3 * 2**-11, float("inf"), -float("inf")])
    x = torch.cat([anywhere.view(torch.float32), dense.view(torch.float32), edges])
    x = x[~torch.isnan(x)].contiguous()
    got = torch.empty(x.numel(), dtype=torch.float16)
    block._attend_c.to_f16(x.data_ptr(), got.data_ptr(), x.numel(), 0.0)
    assert torch.equal(got.view(torch.int16), x.to(torch.float16).view(torch.int16))
    nan = torch.tensor([float("nan")])
    one = torch.empty(1, dtype=torch.float16)
    block._attend_c.to_f16(nan.data_ptr(), one.data_ptr(), 1, 0.0)
    assert torch.isnan(one).all()


@kv16
@pytest.mark.parametrize("isa", ["best", "c"])
@pytest.mark.parametrize("shape", SHAPES)
def test_half_caches_read_as_their_float_values(shape, isa):
    """decode over half caches gives every bit decode gives over float32 caches holding the same
    (half) values: the reads are exact, the arithmetic is the float32 kernel's, on AVX2 (F16C
    loads) and the portable loop."""
    nh, nkv, hd, cap, end = shape
    q, k, v = rand(nh, nkv, hd, cap, 11)
    k16, v16 = k.half(), v.half()
    k16[:, end:] = float("nan")  # never read
    best = block._attend_c.isa()
    if isa == "c":
        block._attend_c.set_isa("c")
    try:
        got = decode_attention(q, k16, v16, end)
        want = decode_attention(q, k16.float(), v16.float(), end)
    finally:
        block._attend_c.set_isa(best)
    assert torch.equal(got, want)


@kv16
@pytest.mark.parametrize("shape", ROPE_SHAPES)
def test_rope_decode_into_half_caches(shape):
    """The fused step on half caches writes the float32 step's K and V rounded as torch rounds them,
    leaves every other cell alone, and attends over the rounded cache exactly as decode does."""
    nh, nkv, hd, n_rot, cap, pos = shape
    g = torch.Generator().manual_seed(sum(shape) + 1)
    qk = torch.randn(1, nh + nkv, hd, generator=g)
    vrow = torch.randn(nkv, hd, generator=g)
    theta = torch.rand(n_rot // 2, generator=g) * 6
    cos = torch.cat([theta.cos(), theta.cos()])[None, None, :].contiguous()
    sin = torch.cat([-theta.sin(), theta.sin()])[None, None, :].contiguous()
    k16 = torch.randn(nkv, cap, hd, generator=g).half()
    v16 = torch.randn(nkv, cap, hd, generator=g).half()
    k16[:, pos + 1:] = float("nan")
    v16[:, pos + 1:] = float("nan")
    k32, v32 = k16.float(), v16.float()
    before_k, before_v = k16.clone(), v16.clone()
    out32, out16 = torch.empty(1, nh * hd), torch.empty(1, nh * hd)
    args = (nh, nkv, hd, n_rot, cap, pos, hd ** -0.5, 2)
    block._attend_c.rope_decode(qk.data_ptr(), vrow.data_ptr(), cos.data_ptr(), sin.data_ptr(), k32.data_ptr(),
                                v32.data_ptr(), out32.data_ptr(), *args)
    block._attend_c.rope_decode_kv16(qk.data_ptr(), vrow.data_ptr(), cos.data_ptr(), sin.data_ptr(), k16.data_ptr(),
                                     v16.data_ptr(), out16.data_ptr(), *args)
    assert torch.equal(k16[:, pos].view(torch.int16), k32[:, pos].half().view(torch.int16))
    assert torch.equal(v16[:, pos].view(torch.int16), vrow.half().view(torch.int16))
    assert torch.equal(k16[:, :pos].view(torch.int16), before_k[:, :pos].view(torch.int16))
    assert torch.isnan(k16[:, pos + 1:]).all() and torch.isnan(v16[:, pos + 1:]).all()
    assert torch.equal(before_v[:, :pos].view(torch.int16), v16[:, :pos].view(torch.int16))
    from node.inference.arch.common import apply_rope
    q = apply_rope(qk, cos, sin, n_rot)[0, :nh]  # torch's rotation: the last bits may differ
    torch.testing.assert_close(out16, decode_attention(q, k16, v16, pos + 1), rtol=1e-5, atol=2e-6)
    best, again = block._attend_c.isa(), torch.empty(1, nh * hd)
    block._attend_c.set_isa("c")
    try:  # the portable loop: the same bits
        k16[:, pos], v16[:, pos] = float("nan"), float("nan")
        block._attend_c.rope_decode_kv16(qk.data_ptr(), vrow.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                         k16.data_ptr(), v16.data_ptr(), again.data_ptr(), *args)
    finally:
        block._attend_c.set_isa(best)
    assert torch.equal(again, out16)


def test_caches_of_a_type_the_kernels_do_not_read_are_refused():
    """bf16, or K and V of different types, would be read as another type's bytes: refused."""
    q, k, v = rand(4, 2, 16, 8, 5)
    with pytest.raises(ValueError, match="KV caches"):
        decode_attention(q, k.bfloat16(), v.bfloat16(), 8)
    with pytest.raises(ValueError, match="KV caches"):
        decode_attention(q, k.half(), v, 8)


@pytest.mark.skipif(not block._FUSED, reason="the compiled row kernels are not built")
def test_row_kernels_give_each_row_the_same_bits_on_every_path_and_thread_count():
    """silu·up's AVX2 loop and the portable one (special values included), and both row kernels on
    1 and 2 threads over many rows: every row the same bits as alone (rows are never mixed)."""
    from node.inference.arch.common import rms_norm

    gen = torch.Generator().manual_seed(11)
    rows, f = 67, 1031  # rows × f over ROWS_PAR_MIN (both threads work), a width off the 8 lanes
    gu = torch.randn(rows, 2 * f, generator=gen) * 6
    gu[0, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -90.0, 88.0])
    x = torch.randn(rows, f, generator=gen) * 3
    w = torch.randn(f, generator=gen)
    best = block._attend_c.isa()
    before = torch.get_num_threads()
    try:
        outs = []
        for isa in dict.fromkeys([best, "c"]):
            block._attend_c.set_isa(isa)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                outs.append((block.silu_mul(gu), rms_norm(x, w, 1e-5)))
        alone = [(block.silu_mul(gu[i:i + 1]), rms_norm(x[i:i + 1], w, 1e-5)) for i in range(rows)]
    finally:
        block._attend_c.set_isa(best)
        torch.set_num_threads(before)
    for silu, rms in outs:
        torch.testing.assert_close(silu, outs[0][0], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(rms, outs[0][1], rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([a[0] for a in alone]), outs[0][0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(torch.cat([a[1] for a in alone]), outs[0][1], rtol=0, atol=0)
    ref = F.silu(gu[:, :f].double()) * gu[:, f:].double()  # and they are silu·up
    finite = torch.isfinite(ref)
    torch.testing.assert_close(outs[0][0].double()[finite], ref[finite], rtol=1e-6, atol=1e-30)
