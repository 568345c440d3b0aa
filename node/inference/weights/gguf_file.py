"""A memory-mapped GGUF file: metadata fields and tensors, materialised one tensor at a time.

The header is walked once with struct over an mmap (long arrays such as a 128k-token vocabulary
are skipped by their lengths: `gguf.GGUFReader` spends ~20 s building numpy views of every
vocabulary string). Tensor data are numpy views into the same mapping, so nothing is read from
disk until a tensor is touched, and a slice that needs layers [a, b) reads only those tensors
(plus the embeddings or the output head at the ends). A partial model's directory
(node/models/partial) opens the same way: its header, and each held tensor in its part file.
Each file is opened once, at the open: what is read later (a slice's embedding rows, on every
request) comes from that descriptor, so a file deleted or replaced by a rename keeps the bytes it
had (on POSIX; on Windows an open file, like its mapping, cannot be deleted or renamed over), and one
written over in place is refused (`FileChangedWhileOpen`: its size or mtime moved), never read as the
old model, unless `vouch` says its new (size, mtime) were hashed as the same bytes (only touched).
`expect`: the (size, mtime_ns) the file was hashed at; a file found otherwise at the open is refused.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from node.errors import ModelLoadError
from node.inference.weights import dequant
from node.models.partial.layout import PartialStore

KEEP_ARRAY_MAX = 1024  # metadata arrays longer than this (vocabularies, merges) are skipped
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in the file."""

    name: str
    shape: tuple[int, ...]  # numpy order: rows first
    tensor_type: GGMLQuantizationType
    offset: int  # absolute, in bytes
    n_bytes: int


class FileChangedWhileOpen(ModelLoadError):
    """A file was written over in place since it was opened: its bytes are no longer those opened."""


class _Header:
    """Cursor over the mapped header."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str):
        try:
            (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error:
            raise ModelLoadError(f"{self.path.name}: truncated GGUF header") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            sub, n = self.unpack("I"), self.unpack("Q")
            if n <= KEEP_ARRAY_MAX:
                return [self.value(sub) for _ in range(n)]
            for _ in range(n):  # skipped, but walked: strings have their own lengths
                if sub in _SCALARS:
                    self.pos += struct.calcsize(_SCALARS[sub]) * n
                    break
                self.value(sub)
            return _Skipped(n)
        raise ModelLoadError(f"{self.path.name}: unknown GGUF value type {vtype}")


@dataclass(frozen=True)
class _Skipped:
    """A long metadata array that was not kept (its length is)."""

    length: int


class GgufFile:
    """Read-only view of one GGUF model file."""

    def __init__(self, path: str | Path, *, header_of_size: int | None = None,
                 expect: tuple[int, int] | None = None):
        """`header_of_size`: `path` holds only the header of a file of that many bytes (a model the
        swarm serves, known here by its header): shapes and metadata are read, no tensor data.
        `expect`: FileChangedWhileOpen unless the file opened has this (size, mtime_ns), the stat its
        sha256 was computed at (2026-12-07, review r36: a file replaced by a rename between a load's
        check and its open was loaded, and its parts cached, under the old sha256)."""
        self.path = Path(path)
        # a partial model (node/models/partial): the header file, and each held tensor in its part
        # file; tensors of the header that are not held are listed but raise when read
        self._where: dict[str, tuple[Path, int, int]] | None = None
        self._size: int | None = header_of_size
        self._parts: dict[Path, mmap.mmap] = {}
        # each file read: (descriptor opened once, its (size, mtime_ns) then); closed with this object
        self._fds: dict[Path, tuple[int, tuple[int, int]]] = {}
        # (file, its fstat now) → whether its bytes at that stat were hashed as the ones opened (a stat,
        # no hashing; set by who knows the sha256: a touched file then reads on); None: any change is refused
        self.vouch: Callable[[Path, os.stat_result], bool] | None = None
        source = self.path
        if PartialStore.is_partial(self.path):
            store = PartialStore(self.path)
            manifest, self._where = store.tensor_locations()
            self._size, source = manifest.size_bytes, store.header_path
        self._mm = self._map(source)
        if expect is not None and self._fds[source][1] != tuple(expect):
            raise FileChangedWhileOpen(f"{self.path.name} changed on disk since it was hashed")
        self.fields: dict[str, object] = {}
        self.tensors: dict[str, TensorEntry] = {}
        self._parse()
        self.arch = str(self.field("general.architecture", ""))

    def _map(self, path: Path) -> mmap.mmap:
        """Map `path`, keeping its descriptor open for later reads (`lookup`)."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise ModelLoadError(f"cannot read GGUF file {self.path.name}: {exc}") from exc
        try:
            st = os.fstat(fd)
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            os.close(fd)
            raise ModelLoadError(f"cannot read GGUF file {self.path.name}: {exc}") from exc
        weakref.finalize(self, os.close, fd)
        self._fds[path] = (fd, (st.st_size, st.st_mtime_ns))
        return mm

    def _check_unchanged(self, path: Path) -> None:
        """FileChangedWhileOpen when `path` was written over in place since it was opened (a stat of
        the descriptor: a deleted or renamed-over file still reads as it was)."""
        fd, opened = self._fds[path]
        st = os.fstat(fd)
        now = (st.st_size, st.st_mtime_ns)
        if now == opened:
            return
        if self.vouch is not None and self.vouch(path, st):  # only touched: the same bytes
            self._fds[path] = (fd, now)
        else:
            raise FileChangedWhileOpen(f"{self.path.name} was written over on disk since it was loaded: "
                                       "its bytes are no longer this model's")

    def check_unchanged(self) -> None:
        """FileChangedWhileOpen when any file read was written over in place since it was opened: a
        load's converted weights were then read (in part) from other bytes than its sha256 names."""
        for path in list(self._fds):
            self._check_unchanged(path)

    def opened_stat(self) -> os.stat_result | None:
        """The stat now of the descriptor the model's own file was opened with (blocking); None for a
        partial model (its header and parts are other files)."""
        opened = self._fds.get(self.path)
        return os.fstat(opened[0]) if opened is not None else None

    @property
    def partial(self) -> bool:
        """True for a partial model (only some tensors held)."""
        return self._where is not None

    def _parse(self) -> None:
        h = _Header(self._mm, self.path)
        if self._mm[:4] != b"GGUF":
            raise ModelLoadError(f"{self.path.name} is not a GGUF file (bad magic)")
        h.pos = 4
        version, n_tensors, n_kv = h.unpack("I"), h.unpack("Q"), h.unpack("Q")
        if version < 2:
            raise ModelLoadError(f"{self.path.name}: GGUF version {version} is too old")
        for _ in range(n_kv):
            key = h.string()
            self.fields[key] = h.value(h.unpack("I"))
        infos = []
        for _ in range(n_tensors):
            name = h.string()
            dims = [h.unpack("Q") for _ in range(h.unpack("I"))]
            infos.append((name, tuple(reversed(dims)), h.unpack("I"), h.unpack("Q")))
        align = int(self.field("general.alignment", 32))
        data_start = (h.pos + align - 1) // align * align
        for name, shape, type_id, offset in infos:
            try:
                qtype = GGMLQuantizationType(type_id)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelLoadError(f"{self.path.name}: tensor {name} has unknown type {type_id}") from None
            n_bytes = int(np.prod(shape, dtype=np.int64)) // block * type_size
            start = data_start + offset
            if start + n_bytes > (len(self._mm) if self._size is None else self._size):
                raise ModelLoadError(f"{self.path.name}: tensor {name} runs past the end of the file")
            self.tensors[name] = TensorEntry(name, shape, qtype, start, n_bytes)

    def field(self, key: str, default=None):
        """A metadata value (scalars, strings and short arrays as Python values), or `default`."""
        value = self.fields.get(key, default)
        return default if isinstance(value, _Skipped) else value

    def arch_field(self, key: str, default=None):
        """`{arch}.{key}`."""
        return self.field(f"{self.arch}.{key}", default)

    def array_length(self, key: str) -> int:
        """Length of a metadata array (kept or skipped), 0 when absent."""
        value = self.fields.get(key)
        return value.length if isinstance(value, _Skipped) else len(value) if isinstance(value, list) else 0

    def has(self, name: str) -> bool:
        """Whether the file holds tensor `name`."""
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy-order shape (rows first) of tensor `name`."""
        return self._tensor(name).shape

    def qtype(self, name: str) -> GGMLQuantizationType:
        """Storage type of tensor `name`."""
        return self._tensor(name).tensor_type

    def _locate(self, name: str) -> tuple[mmap.mmap, Path, int]:
        """Where tensor `name`'s bytes are: (mapping, file, offset in it)."""
        t = self._tensor(name)
        if self._where is None:
            return self._mm, self.path, t.offset
        where = self._where.get(name)
        if where is None or where[2] != t.n_bytes:
            raise ModelLoadError(f"{self.path.name}: tensor {name} is not held by this partial model")
        part, offset, _n = where
        if part not in self._parts:
            self._parts[part] = self._map(part)
        if offset + t.n_bytes > len(self._parts[part]):
            raise ModelLoadError(f"{self.path.name}: tensor {name} runs past the end of {part.name}")
        return self._parts[part], part, offset

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes as a read-only uint8 view [rows, bytes per row] (no copy)."""
        t = self._tensor(name)
        rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
        buf, _path, offset = self._locate(name)
        return np.frombuffer(buf, dtype=np.uint8, count=t.n_bytes, offset=offset).reshape(rows, -1)

    def lookup(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D tensor, dequantized (an embedding lookup), read with pread rather
        than through the mapping: a fault there maps the whole page-cache folio around the row
        into this process (up to 2 MB with transparent huge pages), and 128 random token ids
        added ~126 MB of resident set for 280 KB of rows."""
        t = self._tensor(name)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n_rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        if ids.size and (ids.min() < -n_rows or ids.max() >= n_rows):
            raise IndexError(f"row index out of range for {name} of {n_rows} rows")
        ids = np.where(ids < 0, ids + n_rows, ids)
        _buf, path, offset = self._locate(name)
        if not hasattr(os, "preadv"):  # Windows: through the mapping, which shows a write in place
            out = self.rows(name, ids)
            self._check_unchanged(path)  # (2026-12-07, review r36: not checked, the new bytes were read)
            return out
        row_bytes = t.n_bytes // n_rows
        out = np.empty((ids.size, row_bytes), dtype=np.uint8)
        fd = self._fds[path][0]  # (opened once: reopened by path, a replaced file gave the new bytes)
        for i, r in enumerate(ids.tolist()):
            if os.preadv(fd, [out[i]], offset + r * row_bytes) != row_bytes:
                self._check_unchanged(path)
                raise ModelLoadError(f"{self.path.name}: tensor {name} row {r} is cut short")
        self._check_unchanged(path)  # (after the reads: a write in place during them is seen too)
        return dequant.dequantize(out, t.tensor_type, (ids.size, t.shape[-1]))

    def f32(self, name: str) -> np.ndarray:
        """Tensor `name` dequantized to a float32 array (numpy order), owned by the caller."""
        t = self._tensor(name)
        try:
            return dequant.dequantize(self.raw(name), t.tensor_type, t.shape)
        except ValueError as exc:
            raise ModelLoadError(f"{self.path.name}: tensor {name}: {exc}") from exc

    def f32_or_none(self, name: str) -> np.ndarray | None:
        """`f32(name)` or None when the tensor is absent (optional biases, norms)."""
        return self.f32(name) if self.has(name) else None

    def rows(self, name: str, index: np.ndarray | slice) -> np.ndarray:
        """Selected rows of a 2-D tensor, dequantized (embedding lookup without loading it all)."""
        t = self._tensor(name)
        raw = self.raw(name)[index]
        return dequant.dequantize(raw, t.tensor_type, (raw.shape[0], t.shape[-1]))

    def row_source(self, name: str) -> TensorRows:
        """Tensor `name` as a RowSource (dequantized block by block when converted)."""
        return TensorRows(self, name)

    def release_rows(self, name: str, start: int, stop: int) -> None:
        """Drop the mapped pages holding rows [start, stop) of `name` from the resident set (an
        array still viewing them faults them back in from the page cache: nothing is lost)."""
        if not hasattr(mmap, "MADV_DONTNEED") or stop <= start:
            return
        t = self._tensor(name)
        buf, _path, offset = self._locate(name)
        if not hasattr(buf, "madvise"):
            return
        row_bytes = t.n_bytes // int(np.prod(t.shape[:-1], dtype=np.int64))
        a = (offset + start * row_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        b = min(len(buf), -(-(offset + stop * row_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE)
        if a < b:
            buf.madvise(mmap.MADV_DONTNEED, a, b - a)

    def release_pages(self) -> None:
        """Drop the mapped file pages from this process's resident set (they stay in the page
        cache); later reads fault back in only what they touch, e.g. embedding rows."""
        if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            for mm in (self._mm, *self._parts.values()):
                mm.madvise(mmap.MADV_DONTNEED)

    def _tensor(self, name: str) -> TensorEntry:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelLoadError(f"{self.path.name}: tensor {name} is missing") from None


class TensorRows:
    """A 2-D GGUF tensor as a RowSource (see `weights.linear`)."""

    def __init__(self, f: GgufFile, name: str):
        self.file, self.name = f, name
        self.shape = f.shape(name)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) in float32; the file pages they were read from are dropped from this
        process's resident set at once (a converter reads each block once), so a load holds one
        block of the file at a time, not a layer's (they stay in the page cache)."""
        out = self.file.rows(self.name, slice(start, stop))
        self.file.release_rows(self.name, start, stop)
        return out
