"""Converted slice weights on disk, so that a second load skips the conversion.

    cache = WeightCache(data_dir / "cache" / "weights", budget_bytes=16 << 30)
    key = CacheKey(sha256, fmt="int8", kernel="qgemm", variant="std")
    arrays = cache.read(key, "layer-0003")          # None: absent, stale or corrupt (then removed)
    cache.write(key, "layer-0003", arrays)          # atomic; False when the budget or disk says no

One directory per key: the model file's sha256 (a changed file is another key), the weight
format, the kernel the arrays are laid out for with its layout version (`qgemm1`, `fbgemm2`: a
kernel's conversion changed, its name moves), the conversion variant and `CACHE_VERSION` (bumped
when the file format or every kernel's conversion changes). One file per part (a decoder layer, the output head): parts do not
depend on the slice's range, so slices of one model share them. A file is a magic, a JSON header
naming each array (dtype, shape, offset, crc32) and its key, then the arrays, 64-byte aligned.
Every read checks the header's key and each array's crc32 (3.5 GB/s here, against sha256's 1.5:
the cache guards against torn writes and bad disks, not against someone who can write the data
dir). The budget is kept by evicting whole directories, least recently used first.

Blocking (file I/O): call from a loader's executor thread, never the event loop.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import shutil
import struct
import threading
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from node.logs import kv

log = logging.getLogger(__name__)

CACHE_VERSION = 1
MAGIC = b"SWARMWC1"
ALIGN = 64
MIN_FREE_DISK_BYTES = 2 << 30  # never fill the disk for a cache: leave this much free
_LEN = struct.Struct("<Q")
_USED = ".last-used"  # touched on every read: the directories' LRU order
CACHED_FORMATS = ("int8",)  # f32/f16/bf16 convert at memory speed and are not cached; int8's arrays
# are laid out for a kernel (qgemm or fbgemm), which is part of the key


@dataclass(frozen=True)
class CacheKey:
    """What a cached part depends on."""

    sha256: str
    fmt: str
    kernel: str
    variant: str

    @property
    def dirname(self) -> str:
        return f"{self.sha256[:32]}-{self.fmt}-{self.kernel}-{self.variant}-v{CACHE_VERSION}"

    def header(self, part: str) -> dict[str, str | int]:
        return {"sha256": self.sha256, "fmt": self.fmt, "kernel": self.kernel, "variant": self.variant,
                "version": CACHE_VERSION, "part": part}


def _map_read(fd: int, size: int) -> mmap.mmap:
    """The file mapped read-only, populated in one fault pass where Linux offers it (MAP_POPULATE).
    Elsewhere `access=`: Windows' mmap has no flags, prot or MAP_SHARED (every second load of a
    slice, the first that read the cache, failed there with an AttributeError; 2026-12-06)."""
    if hasattr(mmap, "MAP_POPULATE"):
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ)


# errors that say nothing about the part (the process is out of descriptors or memory): it is kept
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN}


class WeightCache:
    """A directory of converted weights under a size budget (bytes; 0 = nothing is written)."""

    def __init__(self, root: Path, budget_bytes: int):
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()  # eviction and reservation (loads of two slices at once)
        self._reserved: dict[CacheKey, int] = {}

    @property
    def enabled(self) -> bool:
        """False when the budget is 0 (off: nothing is read or written)."""
        return self.budget_bytes > 0

    # --- reading --------------------------------------------------------------------------------

    def read(self, key: CacheKey, part: str) -> dict[str, np.ndarray] | None:
        """The part's arrays, or None when it is absent; a part that is unreadable, truncated, of
        another key or whose crc32 fails is removed (logged). The arrays are read-only views of
        the file mapped (its page-cache pages, not a copy), unmapped when the last of them is
        gone: whoever keeps one keeps the whole part mapped, so copy what you keep."""
        path = self._path(key, part)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    raise ValueError("empty file")
                mapped = _map_read(fh.fileno(), size)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in _TRANSIENT:  # out of descriptors or memory now: the part itself may be fine
                log.warning("DIAG: weight cache part not readable now, converting instead %s",
                            kv(part=path.name, dir=path.parent.name, reason=exc))
                return None
            self._corrupt(path, f"unreadable: {exc}")
            return None
        except ValueError as exc:
            self._corrupt(path, f"unreadable: {exc}")
            return None
        try:
            arrays = _decode(np.frombuffer(mapped, dtype=np.uint8), key.header(part))
        except ValueError as exc:
            self._corrupt(path, str(exc))
            return None
        try:
            os.utime(path.parent / _USED)
        except OSError:
            pass
        return arrays

    def _corrupt(self, path: Path, why: str) -> None:
        log.warning("DIAG: weight cache part unusable, converting again %s", kv(part=path.name, dir=path.parent.name,
                                                                              reason=why))
        try:
            path.unlink()
        except OSError:
            pass

    # --- writing --------------------------------------------------------------------------------

    def reserve(self, key: CacheKey, nbytes: int) -> bool:
        """Make room for about `nbytes` of `key`'s parts (evicting the least recently used other
        keys); False when the budget or the free disk cannot hold them (nothing is written then)."""
        if self.budget_bytes <= 0:
            return False
        with self._lock:
            mine = self.root / key.dirname
            needed = max(0, nbytes - _dir_bytes(mine)) + sum(n for k, n in self._reserved.items() if k != key)
            others = sorted((d for d in self._dirs() if d != mine), key=_last_used)
            total = sum(_dir_bytes(d) for d in self._dirs())
            while others and total + needed > self.budget_bytes:
                victim = others.pop(0)
                freed = _dir_bytes(victim)
                shutil.rmtree(victim, ignore_errors=True)
                total -= freed
                log.info("DIAG: weight cache evicted %s", kv(dir=victim.name, freed_mb=round(freed / 2**20)))
            free = shutil.disk_usage(self.root if self.root.exists() else _existing_parent(self.root)).free
            if total + needed > self.budget_bytes or free - needed < MIN_FREE_DISK_BYTES:
                log.info("DIAG: weight cache not written %s",
                         kv(dir=key.dirname, needed_mb=round(needed / 2**20), budget_mb=round(self.budget_bytes / 2**20),
                            free_disk_mb=round(free / 2**20)))
                return False
            self._reserved[key] = nbytes
            mine.mkdir(parents=True, exist_ok=True)
            (mine / _USED).touch()
            return True

    def release(self, key: CacheKey) -> None:
        """The load that reserved room for `key` is done (its parts are on disk or given up)."""
        with self._lock:
            self._reserved.pop(key, None)

    def write(self, key: CacheKey, part: str, arrays: dict[str, np.ndarray]) -> bool:
        """Store a part atomically (a temporary file renamed over it); False if the disk said no."""
        path = self._path(key, part)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                for chunk in _encode(arrays, key.header(part)):
                    fh.write(chunk)
            os.replace(tmp, path)
            return True
        except OSError as exc:
            log.warning("DIAG: weight cache write failed %s", kv(part=part, dir=key.dirname, error=exc))
            try:
                tmp.unlink()
            except OSError:
                pass
            return False

    def forget(self, sha256: str) -> int:
        """Remove every cached part of the file with this sha256 (its bytes changed under the
        same identity: a partial model whose origin changed); returns the directories removed."""
        gone = 0
        for d in self._dirs():
            if d.name.startswith(sha256[:32] + "-"):
                shutil.rmtree(d, ignore_errors=True)
                gone += 1
        return gone

    # --- housekeeping ---------------------------------------------------------------------------

    def total_bytes(self) -> int:
        return sum(_dir_bytes(d) for d in self._dirs())

    def _dirs(self) -> list[Path]:
        try:
            return [d for d in self.root.iterdir() if d.is_dir()]
        except OSError:
            return []

    def _path(self, key: CacheKey, part: str) -> Path:
        return self.root / key.dirname / f"{part}.swc"


def _encode(arrays: dict[str, np.ndarray], key: dict) -> list[bytes | memoryview]:
    """The file's bytes as chunks: magic, header length, header, then each array aligned."""
    entries, offset = [], 0
    contiguous = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    for name, a in contiguous.items():
        offset = -(-offset // ALIGN) * ALIGN
        entries.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                        "nbytes": a.nbytes, "crc32": zlib.crc32(memoryview(a).cast("B"))})
        offset += a.nbytes
    header = json.dumps({"key": key, "arrays": entries, "payload": offset}).encode()
    start = -(-(len(MAGIC) + _LEN.size + len(header)) // ALIGN) * ALIGN
    chunks: list[bytes | memoryview] = [MAGIC, _LEN.pack(len(header)), header]
    pos = len(MAGIC) + _LEN.size + len(header)
    for e, a in zip(entries, contiguous.values(), strict=True):
        pad = start + e["offset"] - pos
        chunks.append(b"\0" * pad)
        chunks.append(memoryview(a).cast("B"))
        pos += pad + e["nbytes"]
    return chunks


def _decode(buf: np.ndarray, expected_key: dict) -> dict[str, np.ndarray]:
    """The arrays of one file's bytes; ValueError on any mismatch."""
    head = len(MAGIC) + _LEN.size
    if buf.size < head or bytes(buf[: len(MAGIC)]) != MAGIC:
        raise ValueError("not a weight cache file")
    (n,) = _LEN.unpack(bytes(buf[len(MAGIC):head]))
    if head + n > buf.size:
        raise ValueError("truncated header")
    try:
        header = json.loads(bytes(buf[head:head + n]))
        key, entries, payload = header["key"], header["arrays"], int(header["payload"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bad header: {exc}") from None
    if key != expected_key:
        raise ValueError("made for another model, format or version")
    start = -(-(head + n) // ALIGN) * ALIGN
    if start + payload != buf.size:
        raise ValueError(f"size {buf.size} bytes, expected {start + payload}")
    arrays = {}
    for e in entries:
        lo = start + int(e["offset"])
        raw = buf[lo:lo + int(e["nbytes"])]
        if raw.size != int(e["nbytes"]) or zlib.crc32(raw) != e["crc32"]:
            raise ValueError(f"array {e['name']}: checksum mismatch")
        arrays[e["name"]] = raw.view(np.dtype(e["dtype"])).reshape(e["shape"])
    return arrays


def _dir_bytes(d: Path) -> int:
    try:
        return sum(f.stat().st_size for f in d.iterdir() if f.is_file())
    except OSError:
        return 0


def _last_used(d: Path) -> float:
    try:
        return (d / _USED).stat().st_mtime
    except OSError:
        return 0.0


def _existing_parent(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p

