"""The slice engine's own int8 kernel (`_qgemm.c`), wrapped.

    lin = Int8Packed.from_rows(q, scales, bias, keep=arrays)   # pack int8 rows; arrays for the cache
    lin = Int8Packed.from_arrays(arrays)                       # from the cache: no conversion, no copy

Int8Packed keeps int8 weights per output row in the blocked layout the C kernel reads, so what the
weight cache holds is what runs: a cached load maps the file and is done (fbgemm's prepack copies
and re-lays out every weight on every load). Activations are quantized per token to 13–15 bits
in the kernel (see the C file), finer than fbgemm's 7 bits plus residual pass, so this path needs
neither the residual pass nor the rotation of ffn_down's inputs.

`prefill8` matrices (the block's less sensitive ones, as fbgemm's long prefills skip their
residual pass) take 8-bit activations for the rows their caller marks as prompt rows (`rows8`) on
a VNNI CPU, where vpdpbusd runs them at twice the rate; generated rows (decode, batched decode,
speculation's verification rows) keep 13–15 bits. Which rows are which is said, never inferred from
a product's size: a row's bits are then the same in a step of any size and in any batch (a prompt
cut into other steps, or resumed from a kept prefix, computes the same numbers).

Which of it and fbgemm a machine runs is chosen in `weights/kernels.py`.
"""

from __future__ import annotations

import numpy as np
import torch

try:  # built by `pip install` (setup.py); optional: without it int8 runs on fbgemm (f32 without that)
    from node.inference.weights import _qgemm
except ImportError:  # pragma: no cover - depends on the install
    _qgemm = None

LAYOUT_VERSION = 1  # bump when the packed layout changes (the weight cache's key names it)
KERNEL_VERSION = 6  # bump when the kernels or the activation quantization change (the kernel choice)


def available() -> bool:
    """Whether the compiled kernel is installed."""
    return _qgemm is not None


def isa() -> str:
    """The instruction set the compiled kernel runs on here ("avx512vnni", "avx512", "avx2", "c"),
    or "none" when it is not installed."""
    return _qgemm.isa() if _qgemm is not None else "none"


DEQUANT_PARALLEL_BYTES = 1 << 18  # Q8_0 bytes below which dequant_q8_0 runs on the calling thread


def dequant_q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """float32 of `shape` from contiguous GGML Q8_0 bytes, on torch's threads (the same values as
    numpy's value · scale); None when the kernel is not installed or the bytes are not contiguous."""
    if _qgemm is None or not raw.flags.c_contiguous or raw.nbytes % 34:
        return None
    out = np.empty(shape, dtype=np.float32)
    if out.size != raw.nbytes // 34 * 32:
        raise ValueError(f"{raw.nbytes} bytes of Q8_0 do not hold {shape}")
    # a few rows (an embedding lookup each decode step) on one thread: waking the team costs more
    threads = torch.get_num_threads() if raw.nbytes >= DEQUANT_PARALLEL_BYTES else 1
    _qgemm.dequant_q8_0(raw.ctypes.data, raw.nbytes // 34, out.ctypes.data, threads)
    return out


def quantize_rows_into(w: np.ndarray, q: np.ndarray, scales: np.ndarray) -> bool:
    """int8 per row of float32 `w` into `q` and `scales` (as `quantize_rows_int8` computes them);
    False when the kernel is not installed (the caller does it in torch)."""
    if _qgemm is None:
        return False
    w = np.ascontiguousarray(w, dtype=np.float32)
    assert q.flags.c_contiguous and scales.flags.c_contiguous and q.shape == w.shape and scales.shape == w.shape[:1]
    _qgemm.quantize_rows(w.ctypes.data, w.shape[0], w.shape[1], q.ctypes.data, scales.ctypes.data,
                         torch.get_num_threads())
    return True


class Int8Packed:
    """x @ W.T + b with int8 W per output row, packed for `_qgemm.gemm`; float32 in and out."""

    __slots__ = ("bias", "k", "n", "packed", "prefill8", "scales", "_ptrs", "_wsum")

    def __init__(self, packed: np.ndarray, scales: np.ndarray, n: int, k: int, bias: np.ndarray | None, *,
                 prefill8: bool = False):
        if _qgemm is None:
            raise RuntimeError("the compiled int8 kernel is not installed")
        if packed.nbytes != _qgemm.packed_size(n, k) or scales.shape != (n,):
            raise ValueError(f"packed weights of {packed.nbytes} bytes / {scales.shape} scales do not fit [{n}, {k}]")
        self.packed = packed  # may be a read-only view of a mapped cache file: the kernel only reads
        self.scales = np.ascontiguousarray(scales, dtype=np.float32)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.n, self.k = n, k
        self.prefill8 = prefill8
        self._wsum: np.ndarray | None = None
        # the arrays' addresses, read once (numpy's .ctypes builds an object each time: ~1 µs a
        # read, 3 per call, 49 calls a decode step of a 12-layer model); the arrays live as long as self
        self._ptrs = (packed.ctypes.data, self.scales.ctypes.data, 0 if self.bias is None else self.bias.ctypes.data)

    @classmethod
    def from_rows(cls, q: torch.Tensor, scales: torch.Tensor, bias: np.ndarray | None, *,
                  keep: dict[str, np.ndarray] | None = None, prefill8: bool = False) -> Int8Packed:
        """Pack int8 rows `q` [n, k] with their float32 `scales` [n] (`keep` receives the arrays)."""
        n, k = q.shape
        q = q.contiguous()
        packed = np.empty(_qgemm.packed_size(n, k), dtype=np.int8)
        _qgemm.pack(q.data_ptr(), n, k, packed.ctypes.data)
        del q
        if keep is not None:
            keep.update(packed=packed, scales=scales.numpy(), shape=np.array([n, k], dtype=np.int64))
            if bias is not None:
                keep["bias"] = np.array(bias, dtype=np.float32)
        return cls(packed, scales.numpy(), n, k, bias, prefill8=prefill8)

    @classmethod
    def from_source(cls, src, bias: np.ndarray | None, *, block_rows: int, keep: dict[str, np.ndarray] | None = None,
                    prefill8: bool = False) -> Int8Packed:
        """Quantize (as `quantize_rows_int8`) and pack a float32 row source [n, k] a block of
        rows at a time, so that no whole int8 copy is made beside the packed one."""
        n, k = src.shape
        kp = -(-k // 32) * 32
        step = max(4, block_rows // 4 * 4)  # whole 4-row blocks of the packed layout
        packed = np.empty(_qgemm.packed_size(n, k), dtype=np.int8)
        scales = np.empty(n, dtype=np.float32)
        q = np.empty((min(step, n), k), dtype=np.int8)
        for start in range(0, n, step):
            stop = min(start + step, n)
            quantize_rows_into(src.rows(start, stop), q[: stop - start], scales[start:stop])
            _qgemm.pack(q.ctypes.data, stop - start, k, packed[start * kp:].ctypes.data)
        if keep is not None:
            keep.update(packed=packed, scales=scales, shape=np.array([n, k], dtype=np.int64))
            if bias is not None:
                keep["bias"] = np.array(bias, dtype=np.float32)
        return cls(packed, scales, n, k, bias, prefill8=prefill8)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], *, prefill8: bool = False) -> Int8Packed:
        """The matrix `convert(..., keep=arrays)` made, over those arrays (no copy of the weights)."""
        n, k = (int(v) for v in arrays["shape"])
        return cls(arrays["packed"], arrays["scales"], n, k, arrays.get("bias"), prefill8=prefill8)

    @property
    def addresses(self) -> tuple[int, int, int]:
        """(packed weights, scales, bias or 0): what `_qgemm.gemm` reads, for a fused caller."""
        return self._ptrs

    def row_sums(self) -> np.ndarray:
        """Each row's sum of its int8 weights (what 8-bit activations take back off; computed on
        first use: a race computes the same array twice)."""
        if self._wsum is None:
            wsum = np.empty(self.n, dtype=np.int32)
            _qgemm.row_sums(self.packed.ctypes.data, self.n, self.k, wsum.ctypes.data)
            self._wsum = wsum
        return self._wsum

    def __call__(self, x: torch.Tensor, rows8: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, k] float → [T, n] float32. `rows8` (bool [T]): the prompt rows, which a `prefill8`
        matrix computes with 8-bit activations where vpdpbusd makes them faster (elsewhere they
        would cost accuracy for nothing); every other row keeps 13–15 bits."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        T = x.shape[0]
        if x.shape[1] != self.k:
            raise ValueError(f"input of width {x.shape[1]} for a matrix of width {self.k}")
        y = torch.empty(T, self.n, dtype=torch.float32)
        n8 = int(rows8.sum()) if rows8 is not None and self.prefill8 and _qgemm.isa() == "avx512vnni" else 0
        if 0 < n8 < T:  # a step or batch of both kinds: each kind in its own call (rows are exact alone)
            mask = rows8.to(torch.bool)
            y[mask] = self._gemm(x[mask], True)
            y[~mask] = self._gemm(x[~mask], False)
            return y
        self._gemm(x, n8 == T > 0, y)
        return y

    def _gemm(self, x: torch.Tensor, bits8: bool, y: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.empty(x.shape[0], self.n, dtype=torch.float32) if y is None else y
        w, s, b = self._ptrs
        _qgemm.gemm(w, s, self.n, self.k, x.data_ptr(), x.shape[0], y.data_ptr(), b, torch.get_num_threads(),
                    self.row_sums().ctypes.data if bits8 else 0)
        return y
