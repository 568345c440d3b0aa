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


def test_block_decode_step_equals_the_sdpa_path(monkeypatch):
    """A whole block's decode step through the kernel equals the same step through SDPA."""
    import numpy as np

    from node.inference.arch.common import LayerWeights, ModelConfig, RopeConfig, RotaryTables

    cfg = ModelConfig(arch="llama", n_layers=1, hidden=64, n_heads=8, n_kv_heads=2, head_dim=8, ffn=96, vocab=50,
                      n_ctx_train=64, rms_eps=1e-5, rope=RopeConfig(n_rot=8, base=10000.0))
    rng = np.random.default_rng(0)

    def m(r, c):
        return (rng.standard_normal((r, c)) * 0.2).astype(np.float32)

    w = LayerWeights(attn_norm=np.ones(64, np.float32), qkv=m(8 * 8 + 2 * 2 * 8, 64), qkv_bias=None, q_norm=None,
                     k_norm=None, out=m(64, 64), out_bias=None, ffn_norm=np.ones(64, np.float32), gate_up=m(2 * 96, 64),
                     down=m(64, 96))
    b = block.Block.build(w, "f32", torch.device("cpu"))
    rotary = RotaryTables(cfg.rope, torch.device("cpu"))
    x = torch.randn(11, 64, generator=torch.Generator().manual_seed(1))

    def run():
        k, v = torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)
        block.block_forward(b, cfg, x[:10], k, v, 0, rotary.get(0, 10), block.attention_mask(10, 0, 4, torch.device("cpu")))
        return block.block_forward(b, cfg, x[10:], k, v, 10, rotary.get(10, 1), None)

    with torch.inference_mode():
        fast = run()
        monkeypatch.setattr(block, "_attend_c", None)
        slow = run()
    assert float((fast - slow).abs().max()) <= 1e-5 * float(slow.abs().max())  # float32 rounding only
