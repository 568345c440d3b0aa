"""Weight formats of the slice engine: one callable per matrix, chosen per device by measurement.

- `f32`:  float32 weights, F.linear (reference path; exact against llama.cpp's f32 path).
- `bf16` / `f16`: half-precision weights (CUDA; bf16 also on CPU), float32 in and out.
- `int8`: int8 weights per output channel, activations quantized per call by fbgemm's dynamic
  quantized linear (`quantized::linear_dynamic`), or by the compiled qgemm kernel
  (`weights/qgemm.py`; `weights/kernels.py` measures which is faster here). fbgemm: AVX2's 16-bit pair sums
  (vpmaddubsw) must not saturate, so activations are kept to 7 bits (`reduce_range`) over full
  8-bit weights; a residual pass (see `_Int8Dynamic`) buys activation precision back where it is
  cheap or needed.

Every callable maps float32 [T, in] → float32 [T, out], bias included.
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from node import const
from node.inference.weights.qgemm import Int8Packed, quantize_rows_into
from node.inference.weights.qgemm import available as qgemm_built

FORMATS = ("f32", "bf16", "f16", "int8")
Linear = Callable[[torch.Tensor], torch.Tensor]
CHUNK_ROWS = 2048  # rows converted at a time: bounds load-time memory for the output head
CHUNK_ELEMENTS = 1 << 22  # int8 quantization: at most this many weights at a time (16 MB of float32)
RESIDUAL_MAX_ROWS = const.SLICE_RESIDUAL_MAX_ROWS  # int8: inputs up to this many rows always take the residual pass
RESIDUAL_GAIN = 16.0  # int8: residual rows are scaled by this (|K·r| ≤ 8 steps, inside x's range)
PACK_MAX_ROWS = 32768  # int8: taller matrices (vocabulary heads) are packed in row blocks: fbgemm's
# prepack grows faster than its size (a 128256-row head: 3.7 s whole, 1.7 s in 32768-row blocks),
# decode is the same (8.3 ms either way); blocks of layer-sized matrices cost decode time instead
LAYOUT_VERSION = 2  # fbgemm's converted arrays (the weight cache's key names it; 1: pair-safe weights)
REDUCE_RANGE = True  # fbgemm's activations on 7 bits (see _Int8Dynamic)
ACT_QMAX = 127  # the top of that grid


class RowSource(Protocol):
    """A matrix that can be produced in row blocks (float32), e.g. straight from a GGUF tensor."""

    shape: tuple[int, int]

    def rows(self, start: int, stop: int) -> np.ndarray: ...


class ArraySource:
    """RowSource over an in-memory float32 array."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.shape = array.shape

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop]


def fbgemm_available() -> bool:
    """Whether this torch build has the fbgemm dynamic quantized linear (x86 CPU builds do; ARM
    builds do not)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def int8_available() -> bool:
    """Whether an int8 kernel runs here: fbgemm, or the compiled qgemm (whose portable loop is what
    a CPU without fbgemm and without qgemm's x86 kernels, e.g. ARM, runs)."""
    return fbgemm_available() or qgemm_built()


def make_linear(weight: np.ndarray | RowSource, bias: np.ndarray | None, fmt: str, device: torch.device,
                *, sensitive: bool = False, rotate: int = 0, keep: dict[str, np.ndarray] | None = None,
                kernel: str = "fbgemm") -> Linear:
    """A callable computing x @ weight.T + bias in format `fmt` on `device`.

    int8 only: `sensitive` keeps the residual pass in long prefills too (for the head, whose
    errors land directly in the logits, for qkv, and for every matrix with `exact_prefill`); the
    others take one pass with 7-bit activations in long prefills. `rotate` = B multiplies inputs (and weight
    rows) by an orthonormal B×B Hadamard matrix blockwise, which spreads heavy-tailed inputs
    (ffn_down's) evenly over each block. `keep` (int8): receives the converted arrays, from which
    `linear_from_arrays` rebuilds the same callable without converting again (the weight cache).
    `kernel` (int8): "fbgemm", or "qgemm" (`weights/qgemm.py`: 13–15-bit activations, so it needs
    no rotation; matrices neither `sensitive` nor rotated take 8-bit ones for prompt rows).
    """
    src = ArraySource(weight) if isinstance(weight, np.ndarray) else weight
    if fmt == "int8" and kernel == "qgemm":
        return Int8Packed.from_source(src, bias, block_rows=max(1, min(CHUNK_ROWS, CHUNK_ELEMENTS // src.shape[1])),
                                      keep=keep, prefill8=qgemm_prefill8(sensitive, rotate))
    if fmt == "int8":
        return _Int8Dynamic.convert(src, bias, correct_prefill=sensitive, rotate=rotate, keep=keep)
    if keep is not None:
        raise ValueError(f"format {fmt} keeps no converted arrays")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[fmt]
    w = torch.empty(src.shape, dtype=dtype, device=device)
    for start in range(0, src.shape[0], CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, src.shape[0])
        w[start:stop] = torch.from_numpy(np.array(src.rows(start, stop), dtype=np.float32))
    b = torch.from_numpy(np.array(bias, dtype=np.float32)).to(device=device, dtype=dtype) if bias is not None else None
    if dtype == torch.float32:
        return _FloatLinear(w, b)
    return _HalfLinear(w, b)


def linear_from_arrays(arrays: dict[str, np.ndarray], fmt: str, *, sensitive: bool = False, rotate: int = 0,
                       kernel: str = "fbgemm") -> Linear:
    """The callable `make_linear(..., keep=arrays)` built, from those arrays (no conversion;
    `sensitive` and `rotate` as given to make_linear: fbgemm reads its rotation from the arrays)."""
    if fmt != "int8":
        raise ValueError(f"format {fmt} is not rebuilt from arrays")
    if kernel == "qgemm":
        return Int8Packed.from_arrays(arrays, prefill8=qgemm_prefill8(sensitive, rotate))
    return _Int8Dynamic.from_arrays(arrays, correct_prefill=sensitive)


def qgemm_prefill8(sensitive: bool, rotate: int) -> bool:
    """Whether a qgemm matrix takes 8-bit activations for prompt rows (on VNNI): the ones fbgemm runs
    in one pass in long prefills without a rotation. ffn_down's heavy-tailed input keeps 13–15 bits: with 8 (rotated
    or not) the default model's full-prefill top-1 agreement with f32 fell to 0.938 (0.961
    rotated); with out and gate_up alone on 8 bits it is 0.977 (0.984 with none), perplexity
    -0.54% of f32's (-0.39%)."""
    return not sensitive and rotate <= 1


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix of order n (a power of 2): symmetric, H·H = I."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def quantize_rows_int8(src: np.ndarray | RowSource, *,
                       rotate: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (int8 [out, in], float32 scales [out]), in row blocks.

    `rotate` [B, B]: each row is first multiplied by it blockwise (W·H)."""
    src = ArraySource(src) if isinstance(src, np.ndarray) else src
    q = torch.empty(src.shape, dtype=torch.int8)
    scales = torch.empty(src.shape[0], dtype=torch.float32)
    chunk = max(1, min(CHUNK_ROWS, CHUNK_ELEMENTS // src.shape[1]))  # the transients below are a few chunks
    for start in range(0, src.shape[0], chunk):
        stop = min(start + chunk, src.shape[0])
        if rotate is None and quantize_rows_into(src.rows(start, stop), q.numpy()[start:stop], scales.numpy()[start:stop]):
            continue  # the compiled loop: the same values in one pass instead of torch's six
        w = torch.from_numpy(np.array(src.rows(start, stop), dtype=np.float32))
        if rotate is not None:
            w = (w.view(-1, rotate.shape[0]) @ rotate).view(w.shape)
        s = (w.abs().amax(dim=1) / 127.0).clamp_min_(1e-12)
        w.div_(s[:, None]).round_().clamp_(-127, 127)
        q[start:stop] = w
        scales[start:stop] = s
    return q, scales


class _FloatLinear:
    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _HalfLinear(_FloatLinear):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


class _Int8Dynamic:
    """int8 weights (per output row) through fbgemm, with a residual pass for accuracy.

    fbgemm quantizes the whole input with one grid, here of 7 bits (`reduce_range`: AVX2's vpmaddubsw
    adds two u8·s8 products in int16, which 8-bit activations over full 8-bit weights can
    saturate). Rows (tokens) are first scaled to a common range, so a long prefill gets
    per-token grids, not one set by its largest token. The rounding error r = x - x̂
    (|r| ≤ s/2) is what costs accuracy; stacking [x; K·r] as extra rows quantizes r on the same
    grid, and y = W·x̂ + W·(K·r)/K recovers ~11-bit activations. For a few rows (decode) the extra
    rows are free (the kernel is bound by reading the weights); for long prefills they double the
    compute, so there only the matrices that need it (`correct_prefill`) take the residual pass.
    With `rotate`, inputs are multiplied by a blockwise Hadamard matrix H first (and the weights
    were stored as W·H): W·x = (W·H)·(H·x), and a few large values in a block become B moderate
    ones, so the grid is set by the block's energy, not its largest element.
    """

    __slots__ = ("bias", "correct_prefill", "packed", "rotate")
    _op = torch.ops.quantized.linear_dynamic.default  # (x, packed, reduce_range)

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: np.ndarray | None, *, rotate: int,
                 correct_prefill: bool):
        """From int8 rows `q` [out, in] and their float32 `scales` [out] (`rotate`: the Hadamard
        block the rows were multiplied by, 0 for none); fbgemm's prepack copies the weights."""
        self.rotate = hadamard(rotate) if rotate > 1 else None
        scales = scales.double()
        zero = torch.zeros(min(q.shape[0], PACK_MAX_ROWS), dtype=torch.long)
        self.packed = []
        with warnings.catch_warnings():  # the quantized-tensor constructors warn about deprecation
            warnings.simplefilter("ignore")
            for a in range(0, q.shape[0], PACK_MAX_ROWS):
                b = min(a + PACK_MAX_ROWS, q.shape[0])
                qw = torch._make_per_channel_quantized_tensor(q[a:b], scales[a:b], zero[: b - a], 0)
                self.packed.append(torch.ops.quantized.linear_prepack(qw, None))
        self.bias = torch.from_numpy(np.array(bias, dtype=np.float32)) if bias is not None else None
        self.correct_prefill = correct_prefill

    @classmethod
    def convert(cls, weight: RowSource, bias: np.ndarray | None, *, correct_prefill: bool = False,
                rotate: int = 0, keep: dict[str, np.ndarray] | None = None) -> _Int8Dynamic:
        """Quantize a float matrix (`keep` receives q, scales, the rotation block and the bias for
        the weight cache)."""
        assert rotate & (rotate - 1) == 0, "the rotation block is a power of 2"
        block = rotate if rotate > 1 and weight.shape[1] % rotate == 0 else 0
        q, scales = quantize_rows_int8(weight, rotate=hadamard(block) if block else None)
        if keep is not None:
            keep.update(q=q.numpy(), scales=scales.numpy(), rotate=np.array([block], dtype=np.int32))
            if bias is not None:
                keep["bias"] = np.array(bias, dtype=np.float32)
        return cls(q, scales, bias, rotate=block, correct_prefill=correct_prefill)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], *, correct_prefill: bool) -> _Int8Dynamic:
        """The matrix `convert(..., keep=arrays)` made, rebuilt from those arrays (the bias is copied)."""
        block = int(arrays["rotate"][0])
        with warnings.catch_warnings():  # read-only arrays (a mapped cache file): prepack only reads them
            warnings.simplefilter("ignore", UserWarning)
            q, scales = torch.from_numpy(arrays["q"]), torch.from_numpy(np.array(arrays["scales"]))
        return cls(q, scales, arrays.get("bias"), rotate=block, correct_prefill=correct_prefill)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        row_scale = None
        if self.rotate is not None:
            x = (x.reshape(-1, self.rotate.shape[0]) @ self.rotate).view(x.shape)
        if T > 1:  # per-token grids: rows scaled to one range (W is linear: scale back after)
            row_scale = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)
            x = x.div_(row_scale) if self.rotate is not None else x / row_scale
        if T > RESIDUAL_MAX_ROWS and not self.correct_prefill:
            y = self._mm(x)
        else:
            y = self._residual_pass(x)
        if row_scale is not None:
            y *= row_scale
        if self.bias is not None:
            y += self.bias
        return y

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        """fbgemm's product with every row block of the weights (one block below PACK_MAX_ROWS)."""
        if len(self.packed) == 1:
            return self._op(x, self.packed[0], REDUCE_RANGE)
        return torch.cat([self._op(x, p, REDUCE_RANGE) for p in self.packed], dim=1)

    def _residual_pass(self, x: torch.Tensor) -> torch.Tensor:
        """y = W·x̂ + W·(K·r)/K in one kernel call (the small elementwise work in numpy: on a few
        rows its per-call cost is a third of torch's, and decode makes 4 such calls per layer)."""
        T = x.shape[0]
        a = x.numpy()
        stacked = np.empty((2 * T, a.shape[1]), dtype=np.float32)
        stacked[:T] = a
        residual_rows(a, ACT_QMAX, out=stacked[T:])
        y2 = self._mm(torch.from_numpy(stacked))
        y = y2.numpy()
        y[T:] *= 1.0 / RESIDUAL_GAIN
        y[:T] += y[T:]
        return y2[:T]


def choose_qparams(lo: float, hi: float, qmax: int) -> tuple[float, int]:
    """(scale, zero_point) exactly as PyTorch/fbgemm choose them for a dynamic uint8 input."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = _F32.unpack(_F32.pack((hi - lo) / qmax))[0]  # fbgemm keeps the scale as a float32
    if scale == 0.0 or math.isinf(1.0 / scale):
        scale = 0.1
    from_min, from_max = -lo / scale, qmax - hi / scale
    err_min, err_max = abs(lo / scale), abs(qmax) - abs(hi / scale)
    initial = from_min if err_min < err_max else from_max
    zero_point = 0 if initial < 0 else qmax if initial > qmax else round(initial)  # half to even, as rint
    return scale, zero_point


_F32 = struct.Struct("f")


def residual_rows(a: np.ndarray, qmax: int, out: np.ndarray) -> np.ndarray:
    """K·(a - â) into `out`, where â is `a` on the grid fbgemm will use for [a; out] (the rows stay
    inside a's range, so stacking them does not move the grid). Left out, as they only matter at
    exact rounding ties or at the two ends of the range (where an element then loses its
    correction): the integer zero point, and the clamp to [0, qmax] after rounding."""
    lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    scale, _ = choose_qparams(lo, hi, qmax)
    np.multiply(a, np.float32(1.0 / scale), out=out)  # a in grid steps; its rounding error is the residual
    out -= np.rint(out)
    out *= np.float32(scale * RESIDUAL_GAIN)
    return np.clip(out, lo, hi, out=out)
