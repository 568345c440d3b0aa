"""A GGUF file's header: the bytes before its tensor data, which is all a node needs to tokenize,
template and plan a model it holds no weights of.

The header is the fixed prefix, the metadata (tokenizer, chat template, hyper-parameters), the
tensor infos and the alignment padding: `GgufHeader.data_offset` bytes. Its sha256 (the "header
hash") is advertised with every model, so a node that fetches the bytes from a peer or from the
model's origin can check them. Fetched headers are kept in `<data_dir>/headers/`:

  <model sha256>.gguf-header   the header bytes exactly as fetched (checked by hash when read)
  <model sha256>.vocab.gguf    what llama.cpp's vocab-only load reads: the same metadata with no
                               tensors (derived from the header; rewritten whenever it is read)

Why a rewrite: llama.cpp checks every tensor against the file's size even for a vocab-only load,
so the header alone ("tensor data is not within the file bounds") is refused. A sparse file of
the model's full size would pass, but needs the full size on filesystems without sparse files
(FAT, exFAT, some copies) and looks like a multi-GB file to disk-usage tools; a header with zero
tensors (the metadata bytes verbatim, n_tensors = 0, padded to the alignment) is as small as the
header and llama.cpp reads its vocabulary identically. Everything here is blocking: executors.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from pathlib import Path

from node.datadir import write_atomic
from node.errors import ModelLoadError
from node.models.gguf_meta import GgufHeader, parse_header, read_header_bytes
from node.values import is_sha256

log = logging.getLogger(__name__)

HEADERS_DIR = "headers"
_N_TENSORS_AT = 8  # after magic (4) and version (4): u64 tensor count, then u64 key count


class HeaderRefused(ModelLoadError):
    """Header bytes that are not what was advertised (hash, size, layers, architecture)."""

    code = "header_refused"


def extract_header(path: Path) -> tuple[bytes, GgufHeader]:
    """The header bytes of a GGUF file and their parse (blocking)."""
    with open(path, "rb", buffering=1 << 20) as fh:
        header = parse_header(fh, path)
        fh.seek(0)
        data = fh.read(header.data_offset)
    if len(data) != header.data_offset:
        raise ModelLoadError(f"{path.name}: the file ends inside its header")
    return data, header


def header_digest(path: Path) -> tuple[str, int]:
    """(sha256 of the header bytes, their length) of a GGUF file (blocking)."""
    data, header = extract_header(path)
    return hashlib.sha256(data).hexdigest(), header.data_offset


def check_header(data: bytes, *, header_sha256: str, n_layers: int | None = None,
                 architecture: str | None = None, max_bytes: int) -> GgufHeader:
    """Parse fetched header bytes and check them against what the advertiser said; HeaderRefused
    (with the reason) otherwise (blocking: hashes and parses)."""
    if len(data) > max_bytes:
        raise HeaderRefused(f"header of {len(data)} bytes is over the {max_bytes}-byte cap")
    digest = hashlib.sha256(data).hexdigest()
    if digest != header_sha256:
        raise HeaderRefused(f"header hash {digest[:16]} is not the advertised {header_sha256[:16]}")
    try:
        header = read_header_bytes(data)
    except ModelLoadError as exc:
        raise HeaderRefused(f"not a GGUF header: {exc.message}") from exc
    if header.data_offset != len(data):
        raise HeaderRefused(f"header says its data starts at {header.data_offset}, got {len(data)} bytes")
    if n_layers is not None and header.n_layers != n_layers:
        raise HeaderRefused(f"header has {header.n_layers} layers, the advert {n_layers}")
    if architecture is not None and header.architecture != architecture:
        raise HeaderRefused(f"header is {header.architecture!r}, the advert {architecture!r}")
    return header


def vocab_only_gguf(data: bytes, header: GgufHeader) -> bytes:
    """The header rewritten with zero tensors: what llama.cpp's vocab-only load accepts."""
    out = bytearray(data[: header.kv_end])
    out[_N_TENSORS_AT:_N_TENSORS_AT + 8] = struct.pack("<Q", 0)
    out += b"\0" * ((-len(out)) % header.alignment)  # llama.cpp refuses a file shorter than aligned
    return bytes(out)


def read_range(path: Path, offset: int, n: int) -> bytes:
    """Up to n bytes of a file from offset (blocking: an executor)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(n)


class HeaderCache:
    """Fetched headers by model sha256 in `<data_dir>/headers/` (blocking methods: executors)."""

    def __init__(self, directory: Path):
        self.directory = directory

    def header_path(self, sha256: str) -> Path:
        if not is_sha256(sha256):
            raise ValueError("model sha256 must be 64 lower-case hex digits")
        return self.directory / f"{sha256}.gguf-header"

    def vocab_path(self, sha256: str) -> Path:
        return self.header_path(sha256).with_name(f"{sha256}.vocab.gguf")

    def load(self, sha256: str, *, header_sha256: str, n_layers: int | None, architecture: str | None,
             max_bytes: int) -> tuple[Path, GgufHeader] | None:
        """The cached header of a model if it is there and still what is advertised: (the vocab
        file to tokenize from, its parse); None when absent or refused (then it is removed)."""
        path = self.header_path(sha256)
        try:
            if path.stat().st_size > max_bytes:
                raise HeaderRefused("cached header is over the size cap")
            data = path.read_bytes()
            os.utime(path)  # its mtime is when it was last used: prune() keeps the recent ones
        except FileNotFoundError:
            return None
        except (OSError, HeaderRefused) as exc:
            log.warning("DIAG: cached model header unreadable, fetching again model=%s error=%s", sha256[:16], exc)
            path.unlink(missing_ok=True)
            return None
        try:
            header = check_header(data, header_sha256=header_sha256, n_layers=n_layers,
                                  architecture=architecture, max_bytes=max_bytes)
        except HeaderRefused as exc:
            log.warning("DIAG: cached model header refused, fetching again model=%s reason=%s",
                        sha256[:16], exc.message)
            path.unlink(missing_ok=True)
            return None
        return self._write_vocab(sha256, data, header), header

    def store(self, sha256: str, data: bytes, header: GgufHeader) -> Path:
        """Keep checked header bytes; returns the vocab file to tokenize from."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self.header_path(sha256), data)
        return self._write_vocab(sha256, data, header)

    def prune(self, *, max_files: int, max_age_s: float, keep: frozenset[str] = frozenset(),
              now: float | None = None) -> list[str]:
        """Remove cached headers (and their vocab files) not used for max_age_s, then the least
        recently used beyond max_files; models in `keep` (registered now) stay. Returns the
        model sha256s removed."""
        now = time.time() if now is None else now
        try:
            found = [(p.stat().st_mtime, p.name.split(".", 1)[0]) for p in self.directory.glob("*.gguf-header")]
        except OSError:
            return []
        found = [(mtime, sha) for mtime, sha in found if is_sha256(sha) and sha not in keep]
        found.sort(reverse=True)  # newest first
        room = max(0, max_files - len(keep))
        gone = [sha for i, (mtime, sha) in enumerate(found) if i >= room or now - mtime > max_age_s]
        for sha in gone:
            for path in (self.header_path(sha), self.vocab_path(sha)):
                path.unlink(missing_ok=True)
        if gone:
            log.info("DIAG: pruned cached model headers count=%d kept=%d", len(gone), len(found) - len(gone))
        return gone

    def _write_vocab(self, sha256: str, data: bytes, header: GgufHeader) -> Path:
        vocab = self.vocab_path(sha256)
        body = vocab_only_gguf(data, header)
        try:
            if vocab.stat().st_size == len(body) and vocab.read_bytes() == body:
                return vocab
        except FileNotFoundError:
            pass
        write_atomic(vocab, body)
        return vocab
