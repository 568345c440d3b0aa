"""A memory-mapped GGUF file: metadata fields and tensors, materialised one tensor at a time.

`gguf.GGUFReader` maps the file with numpy memmap; nothing is read from disk until a tensor's
data is touched, so a slice that needs layers [a, b) reads only those tensors (plus the
embeddings or the output head at the ends).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from node.errors import ModelLoadError
from node.inference.slice import dequant


class GgufFile:
    """Read-only view of one GGUF model file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.reader = GGUFReader(str(self.path), "r")
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read GGUF file {self.path.name}: {exc}") from exc
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = str(self.field("general.architecture", ""))

    def field(self, key: str, default=None):
        """A metadata value (scalars, strings and arrays as Python values), or `default`."""
        f = self.reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    def arch_field(self, key: str, default=None):
        """`{arch}.{key}`."""
        return self.field(f"{self.arch}.{key}", default)

    def has(self, name: str) -> bool:
        """Whether the file holds tensor `name`."""
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy-order shape (rows first) of tensor `name`."""
        return tuple(int(n) for n in reversed(self._tensor(name).shape))

    def qtype(self, name: str) -> GGMLQuantizationType:
        """Storage type of tensor `name`."""
        return self._tensor(name).tensor_type

    def f32(self, name: str) -> np.ndarray:
        """Tensor `name` dequantized to a float32 array (numpy order)."""
        t = self._tensor(name)
        try:
            return dequant.dequantize(t.data, t.tensor_type, self.shape(name))
        except ValueError as exc:
            raise ModelLoadError(f"{self.path.name}: tensor {name}: {exc}") from exc

    def f32_or_none(self, name: str) -> np.ndarray | None:
        """`f32(name)` or None when the tensor is absent (optional biases, norms)."""
        return self.f32(name) if self.has(name) else None

    def rows(self, name: str, index: np.ndarray | slice) -> np.ndarray:
        """Selected rows of a 2-D tensor, dequantized (embedding lookup without loading it all)."""
        t = self._tensor(name)
        rows, cols = self.shape(name)
        raw = np.asarray(t.data).reshape(rows, -1)[index]
        return dequant.dequantize(raw, t.tensor_type, (raw.shape[0], cols))

    def row_source(self, name: str) -> TensorRows:
        """Tensor `name` as a RowSource (dequantized block by block when converted)."""
        return TensorRows(self, name)

    def release_pages(self) -> None:
        """Drop the mapped file pages from this process's resident set (they stay in the page
        cache); later reads fault back in only what they touch, e.g. embedding rows."""
        mm = getattr(self.reader.data, "_mmap", None)
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)

    def _tensor(self, name: str):
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelLoadError(f"{self.path.name}: tensor {name} is missing") from None


class TensorRows:
    """A 2-D GGUF tensor as a RowSource (see `slice.linear`)."""

    def __init__(self, f: GgufFile, name: str):
        self.file, self.name = f, name
        self.shape = f.shape(name)

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.file.rows(self.name, slice(start, stop))
