"""Fast GGUF header reader: scalar metadata and tensor infos, without loading tensors.

`gguf.GGUFReader` builds numpy views for every string of the vocabulary (hundreds of thousands for
modern models), which is slow for a catalog scan. This reader walks the header through a buffered
file, keeps scalars and short arrays, and skips long arrays by their lengths. Blocking: call it
from an executor.
"""

from __future__ import annotations

import collections
import io
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import gguf

from node.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
KEEP_ARRAY_MAX = 64  # arrays up to this length are kept (e.g. rope factors); longer are skipped
MAX_TENSORS = 1 << 20  # more than any real model: a corrupt count fails here, not after a long walk
MAX_KV = 1 << 16

_SCALARS = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_STRING_MAX = 1 << 24  # a header's string (a chat template is the longest: tens of KB)
_ARRAY_MAX = 1 << 32  # a header's array (a vocabulary: hundreds of thousands)
_NESTING_MAX = 8  # arrays of arrays in a header (real ones: 2 deep at most)
_SKIP_BLOCK = 1 << 20  # a vocabulary's strings are skipped a block at a time


@dataclass
class TensorInfo:
    """A tensor's name, shape (GGUF order: fastest-varying first), type and size in bytes."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        try:
            return gguf.GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type{self.ggml_type}"

    @property
    def n_bytes(self) -> int:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.ggml_type)]
        return self.n_elements // block * type_size


@dataclass
class GgufHeader:
    """Parsed header of a GGUF file."""

    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: list[TensorInfo] = field(default_factory=list)
    kv_end: int = 0  # file offset where the metadata ends (the tensor infos start)
    data_offset: int = 0  # file offset of the tensor data: the header is the bytes before it

    def data_end(self) -> int:
        """The file size the tensors need: the end of the furthest tensor's data (a tensor of a
        type this gguf package does not know counts as ending where it starts); 0 with no tensors
        (a vocabulary-only file ends before the data's alignment padding)."""
        end = 0
        for t in self.tensors:
            try:
                end = max(end, self.data_offset + t.offset + t.n_bytes)
            except (KeyError, ValueError):
                end = max(end, self.data_offset + t.offset)
        return end

    @property
    def alignment(self) -> int:
        """general.alignment (GGUF's default 32), the padding unit before the tensor data."""
        value = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        return value if isinstance(value, int) and 0 < value <= 1 << 16 else DEFAULT_ALIGNMENT

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """`<arch>.<suffix>`, e.g. arch_get("block_count")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def n_layers(self) -> int:
        return int(self.arch_get("block_count", 0))

    @property
    def context_length(self) -> int:
        return int(self.arch_get("context_length", 0))

    @property
    def vocab_size(self) -> int:
        return int(self.array_lengths.get("tokenizer.ggml.tokens", 0))

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def quantization(self) -> str:
        """The dominant tensor type by bytes (what a user calls the file's quantization)."""
        by_type: collections.Counter[str] = collections.Counter()
        for t in self.tensors:
            try:
                by_type[t.type_name] += t.n_bytes
            except (KeyError, ValueError):
                by_type[t.type_name] += t.n_elements
        return by_type.most_common(1)[0][0] if by_type else "unknown"


class _Reader:
    def __init__(self, fh: BinaryIO, path: Path):
        self.fh = fh
        self.path = path  # for messages only (bytes read from memory carry a made-up name)

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise ModelLoadError(f"{self.path.name}: truncated GGUF header")
        return data

    def unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack("<" + fmt, self.read(size))[0]

    def string(self) -> str:
        return self.read(self._string_length()).decode("utf-8", errors="replace")

    def _string_length(self) -> int:
        n = self.unpack("Q", 8)
        if n > _STRING_MAX:
            raise ModelLoadError(f"{self.path.name}: implausible string length {n} in GGUF header")
        return n

    def skip_string(self) -> None:
        # (bounded as string()'s: 2026-12-07, review r72, a peer's header saying 2**63 made the seek
        # raise OverflowError, not the header's refusal)
        self.fh.seek(self._string_length(), 1)

    def skip_strings(self, n: int) -> None:
        """Skip n strings (a vocabulary's tokens and merges: 400,000 of them in Llama 3's header) from
        blocks read at once, not with a read and a seek per string (2026-12-07: 0.36 s per header read,
        and an add reads it three times)."""
        unpack_from = _U64.unpack_from
        while n:
            block = self.fh.read(_SKIP_BLOCK)
            pos, end = 0, len(block)
            while n and pos + 8 <= end:
                after = pos + 8 + unpack_from(block, pos)[0]
                if after > end:
                    break
                pos, n = after, n - 1
            self.fh.seek(pos - end, 1)  # back to the first string not skipped
            if n and pos == 0:  # a string longer than a block, or the end of the data (truncated)
                self.skip_string()
                n -= 1

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self.unpack(fmt, size)
        if vtype == _STRING:
            return self.string()
        raise ModelLoadError(f"{self.path.name}: unknown GGUF value type {vtype}")

    def array(self, depth: int = 1) -> tuple[list[Any] | None, int]:
        if depth > _NESTING_MAX:  # (2026-12-07, review r74: RecursionError, which stopped the node's start)
            raise ModelLoadError(f"{self.path.name}: GGUF header arrays nested more than {_NESTING_MAX} deep")
        sub = self.unpack("I", 4)
        n = self.unpack("Q", 8)
        if n > _ARRAY_MAX:  # (a seek past 2**63 raised OverflowError, not the header's refusal)
            raise ModelLoadError(f"{self.path.name}: implausible array length {n} in GGUF header")
        if n <= KEEP_ARRAY_MAX:
            return [self.value(sub) if sub != _ARRAY else self.array(depth + 1)[0] for _ in range(n)], n
        if sub in _SCALARS:
            self.fh.seek(_SCALARS[sub][1] * n, 1)
        elif sub == _STRING:
            self.skip_strings(n)
        else:
            for _ in range(n):
                self.array(depth + 1)
        return None, n


def read_header(path: str | Path) -> GgufHeader:
    """Parse a GGUF file's header (blocking). A file holding only the header bytes parses too."""
    path = Path(path)
    try:
        fh = open(path, "rb", buffering=1 << 20)  # buffered: one syscall per MiB, not per field
    except OSError as exc:
        raise ModelLoadError(f"cannot open model file {path.name}: {exc.strerror}") from exc
    with fh:
        return parse_header(fh, path)


def read_header_bytes(data: bytes, name: str = "header") -> GgufHeader:
    """Parse a GGUF header held in memory (bytes fetched from a peer or an origin)."""
    return parse_header(io.BytesIO(data), Path(name))


def parse_header(fh: BinaryIO, path: Path) -> GgufHeader:
    """Parse a GGUF header from a binary stream positioned at its start (blocking)."""
    r = _Reader(fh, path)
    if r.read(4) != GGUF_MAGIC:
        raise ModelLoadError(f"{path.name} is not a GGUF file (bad magic)")
    version = r.unpack("I", 4)
    if version < 2:
        raise ModelLoadError(f"{path.name}: GGUF version {version} is too old")
    n_tensors = r.unpack("Q", 8)
    n_kv = r.unpack("Q", 8)
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise ModelLoadError(f"{path.name}: implausible GGUF counts ({n_tensors} tensors, {n_kv} keys)")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("I", 4)
        if vtype == _ARRAY:
            value, n = r.array()
            lengths[key] = n
            if value is not None:
                metadata[key] = value
        else:
            metadata[key] = r.value(vtype)
    kv_end = fh.tell()
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("I", 4)
        if n_dims > 8:
            raise ModelLoadError(f"{path.name}: tensor {name[:64]!r} has {n_dims} dimensions")
        shape = tuple(r.unpack("Q", 8) for _ in range(n_dims))
        ggml_type = r.unpack("I", 4)
        offset = r.unpack("Q", 8)
        tensors.append(TensorInfo(name, shape, ggml_type, offset))
    header = GgufHeader(version, metadata, lengths, tensors, kv_end=kv_end)
    end = fh.tell()
    header.data_offset = end + (-end) % header.alignment
    return header
