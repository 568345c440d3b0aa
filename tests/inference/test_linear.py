"""The int8 weight format: fbgemm's grid reproduced, the residual pass, per-token grids, 7-bit
activations over full 8-bit weights (no int16 saturation) and the Hadamard rotation."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from node.inference.weights import linear
from node.inference.weights.linear import (
    RESIDUAL_MAX_ROWS,
    choose_qparams,
    hadamard,
    make_linear,
    quantize_rows_int8,
)
from tests.inference.reference import needs_fbgemm

CPU = torch.device("cpu")
pytestmark = needs_fbgemm


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


@pytest.mark.parametrize("shift", [0.0, 2.0, -2.0])
def test_choose_qparams_matches_torch(shift):
    gen = torch.Generator().manual_seed(0)
    for i in range(200):
        x = torch.randn(2, 300, generator=gen) * (0.01 + i / 20) + shift
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_tensor_dynamic(x, torch.quint8, True)
        scale, zero = choose_qparams(float(x.min()), float(x.max()), 127)
        assert scale == float(np.float32(q.q_scale()))
        assert zero == q.q_zero_point()


def _int8_exact_weights(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """Weights that int8-per-row represents exactly, so only activation rounding remains."""
    q = torch.randint(-127, 128, (rows, cols), generator=gen).float()
    q[:, 0] = 127
    return q * (torch.rand(rows, 1, generator=gen) / 1000 + 1e-4)


def test_residual_pass_buys_back_activation_precision():
    gen = torch.Generator().manual_seed(1)
    w = _int8_exact_weights(512, 1024, gen)
    lin = make_linear(w.numpy(), None, "int8", CPU, sensitive=True)
    x = torch.randn(1, 1024, generator=gen)
    ref = x @ w.T
    corrected = _rel_err(lin(x), ref)
    uncorrected = _rel_err(lin._mm(x), ref)
    assert corrected < uncorrected / 10


def test_long_prefill_gets_per_token_grids():
    """One loud token must not coarsen the grid of the others."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(256, 512, generator=gen) / 22
    lin = make_linear(w.numpy(), torch.zeros(256).numpy(), "int8", CPU)
    x = torch.randn(RESIDUAL_MAX_ROWS + 24, 512, generator=gen)
    x[0] *= 100.0
    y, ref = lin(x), x @ w.T
    quiet = _rel_err(y[1:], ref[1:])
    shared_grid = _rel_err(lin._mm(x)[1:], ref[1:])
    assert quiet < 0.03
    assert shared_grid > 5 * quiet


def test_bias_is_added_once():
    w = np.eye(64, dtype=np.float32)
    b = np.arange(64, dtype=np.float32)
    lin = make_linear(w, b, "int8", CPU)
    for rows in (1, RESIDUAL_MAX_ROWS + 3):
        x = torch.rand(rows, 64)
        np.testing.assert_allclose(lin(x).numpy(), (x + torch.from_numpy(b)).numpy(), atol=0.02)


@pytest.mark.parametrize("threads", [1, 2])
def test_full_8_bit_weights_take_7_bit_activations_without_saturation(threads):
    """vpmaddubsw adds u8·s8 products of neighbouring columns in int16: with activations on 7 bits
    (≤ 127) two weights at ±127 sum to at most 32258, so fbgemm's result is the exact integer
    product even where every pair is at full scale."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(300, 2048, generator=gen) / 30
    w[:, :2] = w.abs().amax(dim=1, keepdim=True)  # a pair at the top of each row
    q, scales = quantize_rows_int8(w.numpy())
    assert bool((q[:, :2] == 127).all())  # the weights keep their full grid
    lin = make_linear(w.numpy(), None, "int8", CPU, kernel="fbgemm")
    x = torch.rand(7, 2048, generator=gen)
    x[:, :2] = 1.0  # the loud pair's activations at the top of the grid
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = lin._mm(x)
    finally:
        torch.set_num_threads(before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xq = torch.quantize_per_tensor_dynamic(x, torch.quint8, True).dequantize()
    ref = xq @ (q.float() * scales[:, None]).T
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5


def test_hadamard_rotation_is_exact_and_tames_heavy_tails():
    h = hadamard(32)
    torch.testing.assert_close(h @ h, torch.eye(32), atol=1e-6, rtol=0)
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(256, 704, generator=gen) / 26
    x = torch.randn(RESIDUAL_MAX_ROWS + 24, 704, generator=gen) * 0.1
    x[torch.arange(x.shape[0]), torch.randint(0, 704, (x.shape[0],), generator=gen)] = 10.0  # one loud value per token
    ref = x @ w.T
    plain = make_linear(w.numpy(), None, "int8", CPU)
    rotated = make_linear(w.numpy(), None, "int8", CPU, rotate=32)
    assert _rel_err(rotated(x[:1]), ref[:1]) < 0.015  # one row: the residual pass, weights' error only

    def activation_err(lin) -> float:  # one pass over the long input vs the residual pass row by row
        return _rel_err(lin(x), torch.cat([lin(x[i : i + 1]) for i in range(x.shape[0])]))

    assert activation_err(rotated) < activation_err(plain) / 2  # 2.3 measured (7-bit activations)


@pytest.mark.parametrize("sensitive", [False, True])
def test_a_tall_matrix_packed_in_row_blocks_computes_the_same(monkeypatch, sensitive):
    """Vocabulary heads are packed in row blocks (PACK_MAX_ROWS): each block quantizes the same
    input on the same grid, so decode and prefill outputs are bit-identical to one block."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(200, 96, generator=gen).numpy()
    bias = torch.randn(200, generator=gen).numpy()
    whole = make_linear(w, bias, "int8", CPU, sensitive=sensitive)
    monkeypatch.setattr(linear, "PACK_MAX_ROWS", 64)
    blocked = make_linear(w, bias, "int8", CPU, sensitive=sensitive)
    assert len(whole.packed) == 1 and len(blocked.packed) == 4  # 64 + 64 + 64 + 8 rows
    for rows in (1, 3, 40):
        x = torch.randn(rows, 96, generator=gen)
        torch.testing.assert_close(blocked(x.clone()), whole(x.clone()), rtol=0, atol=0)
