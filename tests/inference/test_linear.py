"""The int8 weight format: fbgemm's grid reproduced, the residual pass and per-token grids."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from node.inference.slice.linear import RESIDUAL_MAX_ROWS, choose_qparams, make_linear

CPU = torch.device("cpu")


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
    lin = make_linear(w.numpy(), None, "int8", CPU)
    plain = make_linear(w.numpy(), None, "int8", CPU)
    x = torch.randn(1, 1024, generator=gen)
    ref = x @ w.T
    corrected = _rel_err(lin(x), ref)
    uncorrected = _rel_err(plain._op(x, plain.packed, True), ref)
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
    shared_grid = _rel_err(lin._op(x, lin.packed, True)[1:], ref[1:])
    assert quiet < 0.03
    assert shared_grid > 5 * quiet


def test_bias_is_added_once():
    w = np.eye(64, dtype=np.float32)
    b = np.arange(64, dtype=np.float32)
    lin = make_linear(w, b, "int8", CPU)
    for rows in (1, RESIDUAL_MAX_ROWS + 3):
        x = torch.rand(rows, 64)
        np.testing.assert_allclose(lin(x).numpy(), (x + torch.from_numpy(b)).numpy(), atol=0.02)
