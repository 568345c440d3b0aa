"""The compiled int8 kernel (qgemm): exact integer products on every instruction set this CPU has,
odd shapes, bias, threads; the packed layout; and the per-machine choice between it and fbgemm."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from node.inference.weights import kernels, qgemm
from node.inference.weights.linear import make_linear, quantize_rows_int8
from tests.inference.reference import needs_fbgemm

pytestmark = pytest.mark.skipif(not qgemm.available(), reason="the qgemm extension is not built")

ISAS = ("avx512vnni", "avx512", "avx2", "c")


def _isas_here() -> list[str]:
    best = qgemm.isa()
    return list(ISAS[ISAS.index(best):]) if best in ISAS else ["c"]


@pytest.fixture
def restore_isa():
    best = qgemm.isa()
    yield
    qgemm._qgemm.set_isa(best)


def _reference(q: np.ndarray, scales: np.ndarray, x: np.ndarray, bias: np.ndarray | None, *,
               bits8: bool = False) -> np.ndarray:
    """What the kernel computes, in numpy: x per row to int16 on the kernel's grid (±127 steps with
    `bits8`), exact integer sums, then (float)acc · s[n] · xs[t] in float32 (+ bias)."""
    n, k = q.shape
    lanes = (k + 7) // 8 + 1
    qmax = 127.0 if bits8 else min(32767.0, float(np.floor(2147483647.0 / (127.0 * lanes))))
    m = np.abs(x).max(axis=1).astype(np.float32)
    xs = np.where(m / np.float32(qmax) > np.float32(1e-30), m / np.float32(qmax), np.float32(1.0)).astype(np.float32)
    xq = np.rint(x * (np.float32(1.0) / xs)[:, None]).astype(np.int64)
    acc = (xq @ q.astype(np.int64).T).astype(np.float32)
    y = acc * scales[None, :].astype(np.float32) * xs[:, None]
    return y + bias if bias is not None else y


# k = 4500 spans AVX2's k panels (KPANEL 2048); t = 70 and 43 span token blocks there (40 tokens), 43
# leaving a block of 3 to the plain tiles; odd t leaves a token to the one-row tile
@pytest.mark.parametrize(("n", "k"), [(64, 64), (37, 45), (130, 300), (4, 32), (1, 1), (259, 1027), (37, 4500)])
@pytest.mark.parametrize("t", [1, 2, 3, 5, 9, 33, 43, 70])
def test_every_instruction_set_computes_the_exact_integer_product(n, k, t, restore_isa):
    rng = np.random.default_rng(n * 1000 + k + t)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = torch.from_numpy(rng.standard_normal((t, k)).astype(np.float32) * 3)
    bias = rng.standard_normal(n).astype(np.float32)
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), bias)
    q, scales = quantize_rows_int8(w)
    expected = _reference(q.numpy(), scales.numpy(), x.numpy(), bias)
    before = torch.get_num_threads()
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            try:
                got = lin(x).numpy()
            finally:
                torch.set_num_threads(before)
            np.testing.assert_array_equal(got, expected, err_msg=f"isa {name}, threads {threads}")


@pytest.mark.parametrize("k", [17, 4113, 4121, 8191, 14336, 14353])
def test_long_inputs_cannot_overflow_the_int32_sums(k, restore_isa):
    """Every weight at ±127 and every input at full scale, on every instruction set (AVX2's int32
    lane sums k/8 products, AVX-512's k/16): the exact sum, with either sign."""
    n = 6
    w = np.ones((n, k), dtype=np.float32)
    w[1] *= -1
    w[2, ::2] *= -1  # alternating: the lanes' sums cancel, their magnitudes do not
    x = torch.full((9, k), 5.0)  # 9 rows: AVX2's prefill tiles (int16 weights, k panels) and its one-row tile
    x[1::2] *= -1
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), None)
    row = np.array([5.0 * k, -5.0 * k, -5.0 * (k % 2)])
    expected = np.stack([row if i % 2 == 0 else -row for i in range(9)])
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        y = lin(x).numpy()[:, :3]
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-2, err_msg=name)


@needs_fbgemm
def test_close_to_the_float_product_and_finer_than_fbgemm():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 1024)).astype(np.float32) * 0.02
    x = torch.from_numpy(rng.standard_normal((16, 1024)).astype(np.float32))
    x[:, 7] *= 20  # a heavy-tailed channel, as ffn_down's inputs have
    exact = x @ torch.from_numpy(w).T
    deq_w = quantize_rows_int8(w)
    deq = x @ (deq_w[0].float() * deq_w[1][:, None]).T  # the weights' own rounding, nothing else
    ours = make_linear(w, None, "int8", torch.device("cpu"), kernel="qgemm")(x)
    theirs = make_linear(w, None, "int8", torch.device("cpu"), kernel="fbgemm")(x.clone())
    err = lambda y, ref: float((y - ref).norm() / ref.norm())  # noqa: E731
    # activations on 15 bits (here with one channel 20x the rest: ~11 for the others), where fbgemm
    # keeps 8 plus a residual pass
    assert err(ours, deq) < 5e-4, (err(ours, deq), err(theirs, deq))
    assert err(ours, exact) < err(theirs, exact)  # the weights' grids are alike: activations decide


def test_bad_shapes_and_pointers_are_refused():
    with pytest.raises(ValueError):
        qgemm.Int8Packed(np.zeros(10, dtype=np.int8), np.ones(4, dtype=np.float32), 4, 32, None)
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(np.ones((4, 32), dtype=np.float32)), None)
    with pytest.raises(ValueError, match="width"):
        lin(torch.ones(1, 31))
    with pytest.raises(ValueError):
        qgemm._qgemm.gemm(0, 0, 4, 32, 0, 1, 0, 0, 1)
    with pytest.raises(TypeError):
        qgemm._qgemm.gemm(1, 2, 3)
    with pytest.raises(ValueError):
        qgemm._qgemm.packed_size(-8, -64)
    with pytest.raises(ValueError, match="not available"):
        qgemm._qgemm.set_isa("amx-dreams")


def test_a_non_contiguous_or_half_input_is_taken(restore_isa):
    w = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), None)
    x = torch.randn(64, 3).T  # [3, 64], not contiguous
    np.testing.assert_allclose(lin(x).numpy(), lin(x.contiguous()).numpy())
    assert lin(x.half()).dtype == torch.float32


# --- the choice -------------------------------------------------------------------------------------


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.delenv("SWARMLLM_INT8_KERNEL", raising=False)
    monkeypatch.setattr(kernels, "_chosen", {})


@needs_fbgemm
def test_the_choice_is_measured_once_remembered_and_remeasured_when_the_machine_changes(
        fresh_choice, tmp_path, monkeypatch, caplog):
    path = tmp_path / "int8-kernel.json"
    calls = []
    real = kernels.measure
    monkeypatch.setattr(kernels, "measure", lambda width: calls.append(width) or real(width, rounds=1))
    with caplog.at_level(logging.INFO, logger="node.inference.weights.kernels"):
        kernel = kernels.choose_int8_kernel(128, remember=path)
    assert kernel in kernels.KERNELS and calls == [128]
    assert "DIAG: int8 kernel chosen by measurement" in caplog.text
    record = json.loads(path.read_text())[0]
    assert record["kernel"] == kernel and record["isa"] == qgemm.isa() and record["width"] == 128
    assert record["qgemm_request_ms"] > 0 and record["fbgemm_request_ms"] > 0
    # a new process (the in-memory choice forgotten) reads it back without measuring
    monkeypatch.setattr(kernels, "_chosen", {})
    assert kernels.choose_int8_kernel(128, remember=path) == kernel and calls == [128]
    # what the file says is what runs, even when it says the other kernel
    other = "fbgemm" if kernel == "qgemm" else "qgemm"
    path.write_text(json.dumps([dict(record, kernel=other)]))
    monkeypatch.setattr(kernels, "_chosen", {})
    assert kernels.choose_int8_kernel(128, remember=path) == other and calls == [128]
    # another torch (or CPU, kernel version, threads) is another machine: measured again, both kept
    path.write_text(json.dumps([dict(record, torch="0.0-other")]))
    monkeypatch.setattr(kernels, "_chosen", {})
    kernels.choose_int8_kernel(128, remember=path)
    assert calls == [128, 128] and len(json.loads(path.read_text())) == 2


@needs_fbgemm
def test_a_damaged_choice_file_is_measured_again(fresh_choice, tmp_path, monkeypatch):
    path = tmp_path / "int8-kernel.json"
    path.write_text("{not json")
    monkeypatch.setattr(kernels, "measure", lambda width: {"kernel": "qgemm", "qgemm_request_ms": 1.0,
                                                         "fbgemm_request_ms": 2.0, "measured_at": "now"})
    assert kernels.choose_int8_kernel(64, remember=path) == "qgemm"
    assert json.loads(path.read_text())[0]["kernel"] == "qgemm"


def test_a_near_tie_or_a_noisy_win_goes_to_qgemm_whose_rows_are_exact_alone():
    assert kernels.faster(10.0, 9.0) == kernels.faster(10.0, 8.1) == "qgemm"  # within FBGEMM_MARGIN
    assert kernels.faster(10.0, 7.9) == "fbgemm"
    assert kernels.chosen_from([(10.0, 5.0)] * 5) == "fbgemm"  # faster in every pair
    # a busy machine: the best of each kernel favours fbgemm (the old rule), not every pair does
    pairs = [(145.0, 80.0), (100.0, 75.0), (150.0, 90.0), (120.0, 81.0), (160.0, 200.0)]
    assert kernels.faster(min(q for q, _ in pairs), min(f for _, f in pairs)) == "fbgemm"
    assert kernels.chosen_from(pairs) == "qgemm"
    assert kernels.chosen_from([]) == "qgemm"


@needs_fbgemm
def test_the_environment_can_force_a_kernel(fresh_choice, monkeypatch):
    monkeypatch.setenv("SWARMLLM_INT8_KERNEL", "fbgemm")
    assert kernels.choose_int8_kernel(64) == "fbgemm"


def test_a_row_computes_the_same_bits_alone_or_in_any_batch(restore_isa):
    """Each token is quantized on its own grid and summed in exact integers: batching a decode
    step with others (or a verify row with its draft) cannot move its output by one bit."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((300, 520)).astype(np.float32)
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), rng.standard_normal(300).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((37, 520)).astype(np.float32))
    x[5] *= 1000  # a row with a far larger range does not coarsen the others
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        batch = lin(x)
        for i in (0, 5, 6, 36):
            assert torch.equal(lin(x[i:i + 1]), batch[i:i + 1]), name
        assert torch.equal(lin(x[3:11]), batch[3:11]), name


def test_the_compiled_conversion_gives_the_numpy_and_torch_values_bit_for_bit(monkeypatch):
    """Q8_0 → float32 and float32 → int8 rows at load: the same bits as the reference code."""
    from gguf import GGMLQuantizationType

    from node.inference.weights import dequant, linear

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((70, 320)) * rng.random((70, 1)) * 3).astype(np.float32)
    w[3] = 0.0  # an all-zero row (scale clamped), a subnormal-scale block, exact ±127 steps
    w[4, :32] = 1e-3  # scale 7.9e-6: an f16 subnormal
    w[5, :] = np.linspace(-127, 127, 320, dtype=np.float32)
    raw = dequant.quantize(w, GGMLQuantizationType.Q8_0)
    values, scales = dequant.q8_0_blocks(raw, w.shape)
    numpy_path = (values.reshape(*scales.shape, 32).astype(np.float32) * scales[..., None]).reshape(w.shape)
    np.testing.assert_array_equal(dequant.dequantize(raw, GGMLQuantizationType.Q8_0, w.shape), numpy_path)
    q_fast, s_fast = linear.quantize_rows_int8(numpy_path)
    monkeypatch.setattr(linear, "quantize_rows_into", lambda *a: False)
    q_torch, s_torch = linear.quantize_rows_int8(numpy_path)
    assert torch.equal(q_fast, q_torch) and torch.equal(s_fast, s_torch)
    monkeypatch.undo()
    bad = numpy_path.copy()
    bad[7, 3] = np.nan  # a NaN weight: a NaN row (defined), the others as before
    q_bad, s_bad = linear.quantize_rows_int8(bad)
    assert torch.isnan(s_bad[7]) and not q_bad[7].any()
    assert torch.equal(q_bad[:7], q_torch[:7]) and torch.equal(s_bad[8:], s_torch[8:])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_input_row_gives_nan_outputs_and_leaves_the_other_rows(bad, restore_isa):
    """As a float product would: not finite garbage from converting NaN to an integer."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((40, 100)).astype(np.float32)
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), None)
    x = torch.from_numpy(rng.standard_normal((9, 100)).astype(np.float32))
    clean = lin(x)
    x[4, 17] = bad
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        y = lin(x)
        assert torch.isnan(y[4]).all(), name
        assert torch.equal(torch.cat([y[:4], y[5:]]), torch.cat([clean[:4], clean[5:]])), name


def _gemm8(lin: qgemm.Int8Packed, x: torch.Tensor, threads: int = 1) -> np.ndarray:
    """The kernel's 8-bit-activation product, asked for directly (on any instruction set)."""
    y = torch.empty(x.shape[0], lin.n)
    x = x.contiguous()
    qgemm._qgemm.gemm(lin.packed.ctypes.data, lin.scales.ctypes.data, lin.n, lin.k, x.data_ptr(), x.shape[0],
                      y.data_ptr(), 0 if lin.bias is None else lin.bias.ctypes.data, threads,
                      lin.row_sums().ctypes.data)
    return y.numpy()


@pytest.mark.parametrize(("n", "k"), [(64, 64), (37, 45), (130, 300), (1, 1), (259, 1027)])
@pytest.mark.parametrize("t", [1, 7, 8, 9, 33, 70])
def test_eight_bit_activations_give_the_same_integers_on_every_instruction_set(n, k, t, restore_isa):
    """VNNI's vpdpbusd path (x + 128 as bytes, 128 · sum(w) taken back off) and the 16-bit kernels
    fed the same ±127 integers agree bit for bit with the numpy reference."""
    rng = np.random.default_rng(n * 7 + k * 3 + t)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = torch.from_numpy(rng.standard_normal((t, k)).astype(np.float32) * 3)
    bias = rng.standard_normal(n).astype(np.float32)
    q, scales = quantize_rows_int8(w)
    lin = qgemm.Int8Packed.from_rows(q, scales, bias)
    np.testing.assert_array_equal(lin.row_sums(), q.numpy().astype(np.int64).sum(axis=1))
    expected = _reference(q.numpy(), scales.numpy(), x.numpy(), bias, bits8=True)
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        for threads in (1, 2):
            np.testing.assert_array_equal(_gemm8(lin, x, threads), expected, err_msg=f"isa {name}, threads {threads}")


@pytest.mark.parametrize("k", [17, 8191, 14353])
def test_eight_bit_sums_of_long_inputs_are_exact(k, restore_isa):
    """Weights at ±127, inputs at full scale (255 · 127 per unsigned product): no lane overflows."""
    w = np.ones((6, k), dtype=np.float32)
    w[1] *= -1
    w[2, ::2] *= -1
    x = torch.full((9, k), 5.0)
    x[1] *= -1
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), None)
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        y = _gemm8(lin, x)[:2, :3]
        np.testing.assert_allclose(y, [[5.0 * k, -5.0 * k, -5.0 * (k % 2)], [-5.0 * k, 5.0 * k, 5.0 * (k % 2)]],
                                   rtol=1e-5, atol=1e-2, err_msg=name)


def test_eight_bit_activations_keep_a_non_finite_row_to_itself(restore_isa):
    rng = np.random.default_rng(8)
    lin = qgemm.Int8Packed.from_rows(*quantize_rows_int8(rng.standard_normal((12, 70)).astype(np.float32)), None)
    x = torch.from_numpy(rng.standard_normal((10, 70)).astype(np.float32))
    clean = _gemm8(lin, x)
    x[3, 5] = float("nan")
    for name in _isas_here():
        qgemm._qgemm.set_isa(name)
        y = _gemm8(lin, x)
        assert np.isnan(y[3]).all(), name
        np.testing.assert_array_equal(np.delete(y, 3, axis=0), np.delete(clean, 3, axis=0), err_msg=name)


@pytest.mark.parametrize("t", [1, 3, 33, 70])
def test_only_marked_rows_of_a_prefill8_matrix_take_eight_bits_whatever_the_product_size(t):
    """The prompt rows (`rows8`) of a `prefill8` matrix take 8 bits where VNNI makes them faster;
    every other row, and every row of another matrix, keeps 13–15 bits; each row's numbers are the
    same in a product of any size and mix (a prompt cut into other steps, a batch of both kinds)."""
    rng = np.random.default_rng(9 + t)
    w = rng.standard_normal((40, 300)).astype(np.float32)
    q, scales = quantize_rows_int8(w)
    fast = qgemm.Int8Packed.from_rows(q, scales, None, prefill8=True)
    exact = qgemm.Int8Packed.from_rows(q, scales, None)
    vnni = qgemm.isa() == "avx512vnni"
    x = torch.from_numpy(rng.standard_normal((t, 300)).astype(np.float32))
    rows8 = torch.from_numpy(rng.random(t) < 0.5)
    ref16 = _reference(q.numpy(), scales.numpy(), x.numpy(), None)
    ref8 = _reference(q.numpy(), scales.numpy(), x.numpy(), None, bits8=vnni)
    want = np.where(rows8.numpy()[:, None], ref8, ref16)
    for marks in (rows8, torch.ones(t, dtype=torch.bool), torch.zeros(t, dtype=torch.bool), None):
        expected = ref16 if marks is None else np.where(marks.numpy()[:, None], ref8, ref16)
        np.testing.assert_array_equal(fast(x, marks).numpy(), expected, err_msg=f"t={t}")
        np.testing.assert_array_equal(exact(x, marks).numpy(), ref16, err_msg=f"t={t}")
    np.testing.assert_array_equal(fast(x, rows8).numpy(), want)
    for i in range(t):  # each row alone, as a 1-row step of its kind
        np.testing.assert_array_equal(fast(x[i:i + 1], rows8[i:i + 1]).numpy(), want[i:i + 1], err_msg=f"row {i}")


@pytest.mark.parametrize(("n", "block_rows"), [(37, 8), (37, 5), (4, 2048), (130, 64)])
def test_packing_block_by_block_gives_the_same_bytes_as_packing_whole(n, block_rows):
    """`from_source` (a load's path: no whole int8 copy) against quantize-all-then-pack."""
    from node.inference.weights.linear import ArraySource

    w = np.random.default_rng(n + block_rows).standard_normal((n, 45)).astype(np.float32)
    whole = qgemm.Int8Packed.from_rows(*quantize_rows_int8(w), None)
    kept: dict[str, np.ndarray] = {}
    blocks = qgemm.Int8Packed.from_source(ArraySource(w), None, block_rows=block_rows, keep=kept)
    np.testing.assert_array_equal(blocks.packed, whole.packed)
    np.testing.assert_array_equal(blocks.scales, whole.scales)
    assert qgemm.Int8Packed.from_arrays(kept).packed is kept["packed"]


def test_without_fbgemm_int8_runs_on_qgemm_even_on_its_portable_loop(fresh_choice, synth_model, monkeypatch,
                                                                      restore_isa, caplog):
    """A torch without fbgemm (ARM builds) on a CPU where only qgemm's C loop runs (ARM): auto slices
    are int8 on qgemm, unmeasured, with the bits of every other instruction set; fbgemm asked for by
    name is refused clearly."""
    from node.errors import ModelLoadError
    from node.inference.slice import SliceModel, formats
    from node.inference.synth import SynthSpec
    from node.inference.weights import linear
    from tests.inference.reference import our_logits

    path = synth_model(SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=300, n_layers=2, n_ctx=64))
    tokens = [1, *range(10, 30)]
    if qgemm.isa() != "c":  # the 16-bit kernels' bits (VNNI's 8-bit prompt products are its alone)
        qgemm._qgemm.set_isa("avx2")
    best = our_logits(SliceModel.load(path, dtype="int8", kernel="qgemm"), tokens, decode_from=12)
    for module in (linear, kernels, formats):
        monkeypatch.setattr(module, "fbgemm_available", lambda: False)
    monkeypatch.setattr(kernels, "measure", lambda width: pytest.fail("nothing to measure against"))
    qgemm._qgemm.set_isa("c")
    assert formats.resolve_format("auto", torch.device("cpu")) == "int8"
    model = SliceModel.load(path)  # dtype auto, kernel chosen
    assert model.fmt == "int8" and model.kernel == "qgemm"
    np.testing.assert_array_equal(our_logits(model, tokens, decode_from=12), best)
    with pytest.raises(ModelLoadError, match="fbgemm is not in this torch build"):
        SliceModel.load(path, dtype="int8", kernel="fbgemm")
    monkeypatch.setenv("SWARMLLM_INT8_KERNEL", "fbgemm")  # a forced kernel that is not there: the other,
    monkeypatch.setattr(kernels, "_ignored_forced", set())  # said once
    with caplog.at_level(logging.WARNING, logger="node.inference.weights.kernels"):
        assert kernels.choose_int8_kernel(64) == "qgemm"
        assert kernels.choose_int8_kernel(64) == "qgemm"
    assert caplog.text.count("SWARMLLM_INT8_KERNEL=fbgemm ignored: not available here") == 1
