"""The model hash cache (`model_hashes.json` in the data dir): a file's sha256 per (path, size,
mtime_ns), computed once (a second caller for a file being hashed waits for that hash), with where
the file came from (its origin URL and whether that origin is public). Moved out of catalog.py
(2026-12-06, at 501 lines); catalog.py imports it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from node import const
from node.datadir import cannot_read, keep_aside, present, read_data_file, write_atomic
from node.logs import kv
from node.models.header import header_digest
from node.models.origin_record import PUBLIC_RULE, UNCHECKED, OriginRecord
from node.values import is_int, is_sha256

__all__ = ["PUBLIC_RULE", "UNCHECKED", "HashCache", "HashingStopped", "OriginRecord", "sha256_file"]

log = logging.getLogger(__name__)

HASH_CACHE_FILE = "model_hashes.json"


class HashingStopped(OSError):
    """The node is stopping: a file's hash was given up (a scan skips the file)."""


def sha256_file(path: Path, stop: threading.Event | None = None) -> str:
    """Stream a file through sha256 (blocking); raises HashingStopped once `stop` is set."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(const.HASH_CHUNK_BYTES):
            if stop is not None and stop.is_set():
                raise HashingStopped(f"hashing {path.name} stopped: the node is stopping")
            digest.update(chunk)
    return digest.hexdigest()




def _well_formed(record: Any) -> bool:
    """A record as this cache writes it: a sha256 of 64 hex digits, an integer size and mtime_ns."""
    return isinstance(record, dict) and is_sha256(record.get("sha256")) \
        and is_int(record.get("size")) and is_int(record.get("mtime_ns"))


def _record(value: object) -> dict[str, Any] | None:
    """A stored record as the cache uses it, or None for one of another shape (hand-edited, another
    version): its header fields are dropped when they are not of their types."""
    if not _well_formed(value):  # (2026-12-07, review r31: a missing or null sha256 made the catalog's scan fail)
        return None
    if not (isinstance(value.get("header_sha256"), str) and isinstance(value.get("header_bytes"), int)):
        value = {k: v for k, v in value.items() if k not in ("header_sha256", "header_bytes")}
    return value


def _keep_origin(record: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """`record` with `old`'s origin (where the file came from, its check) when both hold the same
    bytes' sha256 and `record` names no origin of its own (a file touched and hashed again, a record
    read again from disk); else `record` as it is."""
    if old and old.get("sha256") == record.get("sha256") and not OriginRecord.from_json(record).url \
            and (origin := OriginRecord.from_json(old)).url:
        return origin.merged_into(record)
    return record


def _read(path: Path, *, tries: int = const.DATA_FILE_READ_TRIES, quiet: bool = False
          ) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The records of model_hashes.json (blocking), and why they must not be saved for now (None: they
    may). Only a damaged file (not JSON, not an object: a crash cut it), or a folder where it belongs
    (it cannot hold the cache), is moved aside, to model_hashes.json.broken (-2, -3...: never over an
    earlier one); one that could not be read this moment (a sync tool's or antivirus' lock, EACCES,
    EIO, a link to nothing), or could not be moved aside, is left as it is and nothing is saved over it
    until it reads (HashCache._save tries again; 2026-12-07, reviews r33, r38). Records of another
    shape are dropped (they were an AttributeError traceback). `quiet`: a file still not movable is
    not said again."""
    if not present(path):  # none (nor a device: /dev/full reads without end)
        return {}, None
    if path.is_dir():  # (a folder: every start rehashed and saved nothing; 2026-12-07, review r38)
        try:
            kept = keep_aside(path)
        except OSError as exc:
            return {}, cannot_read(path, exc)
        log.warning("DIAG: model hash cache was a directory where a file belongs, files are hashed again %s",
                    kv(path=path, old_file=f"kept as {kept.name}"))
        return {}, None
    try:
        data = json.loads(read_data_file(path, tries=tries).decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
    except FileNotFoundError as exc:
        if path.is_symlink():  # a link to a folder not mounted yet: not none
            return {}, cannot_read(path, exc)
        return {}, None
    except OSError as exc:  # not damaged: kept as it is, and not overwritten
        return {}, f"not read ({exc.strerror or exc})"
    except ValueError as exc:
        try:
            kept = f"kept as {keep_aside(path).name}"
        except OSError as move:
            if not quiet:
                log.warning("DIAG: model hash cache damaged, files are hashed again %s",
                            kv(path=path, error=exc, old_file=f"not moved aside: {move.strerror or move}"))
            return {}, "damaged, and not moved aside"
        log.warning("DIAG: model hash cache unreadable, files are hashed again %s",
                    kv(path=path, error=exc, old_file=kept))
        return {}, None
    records = {k: r for k, v in data.items() if isinstance(k, str) and (r := _record(v)) is not None}
    if len(records) < len(data):
        log.warning("DIAG: model hash cache records of another shape dropped %s",
                    kv(path=path, dropped=len(data) - len(records), kept=len(records)))
    return records, None


def _prune(records: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """Drop (blocking: stats every file) the records of files gone from a folder still there and not
    empty, then the least recently hashed past HASH_CACHE_MAX_RECORDS; how many of each were dropped.
    A file whose folder is missing or empty is kept: a drive or share not mounted yet is not a file
    deleted (an fstab mount point is an empty folder until it is mounted: review r51, every model on
    it was to be hashed again, and a download's origin record was lost for good)."""
    folders: dict[str, bool] = {}  # folder -> there and not empty

    def in_place(folder: str) -> bool:
        if folder not in folders:
            try:
                with os.scandir(folder) as entries:
                    folders[folder] = any(True for _ in entries)
            except OSError:
                folders[folder] = False
        return folders[folder]

    gone = [key for key in records if not os.path.lexists(key) and in_place(os.path.dirname(key))]
    for key in gone:
        del records[key]
    return len(gone), _bound(records)


def _bound(records: dict[str, dict[str, Any]]) -> int:
    """Drop the least recently hashed records past HASH_CACHE_MAX_RECORDS; how many."""
    over = max(0, len(records) - const.HASH_CACHE_MAX_RECORDS)
    for key in list(records)[:over]:  # (a dict keeps insertion order: hashed longest ago first)
        del records[key]
    return over


class HashCache:
    """sha256 per (path, size, mtime_ns), persisted as JSON in the data dir."""

    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()  # scans and downloads use it from executor threads at once
        self.stop = threading.Event()  # set when the node stops: a hash in progress gives up
        self._data: dict[str, dict[str, Any]] = {}
        self._unsaved = False  # the last save failed (said once)
        self._origin_said = False  # a download's origin record could not be saved (said once)
        # hashes in progress, by file → (size, mtime_ns, done, [digest]): a second caller for the same
        # file (a download's completion and the folder watch, the GUI's Add) waits for the first one's
        # result instead of reading the whole file again beside it
        self._hashing: dict[str, tuple[int, int, threading.Event, list[str]]] = {}
        self._kept: str | None = None  # why model_hashes.json is left as it is this run (nothing saved over it)
        # read by load(), not here: the node is built on the event loop, and a locked file is read
        # again after a pause (read_data_file); Node.start loads it in an executor (2026-12-07)
        self._loaded = path is None

    def load(self) -> None:
        """Read model_hashes.json (blocking; once: every other method calls it first)."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            assert self.path is not None
            self._data, self._kept = _read(self.path)
            self._loaded = True
            gone, over = _prune(self._data)  # (load runs in an executor: Node.start)
            if (gone or over) and not self._kept:
                log.info("DIAG: model hash cache records dropped %s", kv(
                    path=self.path, files_gone=gone, over_max=over, kept=len(self._data)))
                self._save()
        if self._kept:
            log.warning("DIAG: model hash cache %s: files are hashed again, and nothing is saved over it "
                        "until it can be read (the file is left as it is) %s", self._kept, kv(path=self.path))

    def get_or_compute(self, file: Path) -> str:
        self.load()
        st = file.stat()
        key = str(file.resolve())
        with self._lock:
            hit = self._data.get(key)
            if hit and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns:
                self._data[key] = self._data.pop(key)  # used: the last the bound drops
                return hit["sha256"]
            running = self._hashing.get(key)
            mine = running is None or running[:2] != (st.st_size, st.st_mtime_ns)
            if mine:
                running = self._hashing[key] = (st.st_size, st.st_mtime_ns, threading.Event(), [])
        assert running is not None
        if not mine:
            log.info("DIAG: model file already being hashed, waiting for it %s", kv(name=file.name))
            running[2].wait()
            if running[3]:
                return running[3][0]
            return self.get_or_compute(file)  # that one failed or stopped: this caller's own try
        try:
            started = time.monotonic()
            digest = sha256_file(file, self.stop)
            log.info("DIAG: hashed model file name=%s size_mb=%.1f elapsed_ms=%d", file.name,
                     st.st_size / 2**20, (time.monotonic() - started) * 1000)
            with self._lock:
                record: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
                # the record as it is now, not as read before hashing: an origin check recorded
                # meanwhile (set_public swaps in a new dict) is kept (2026-12-07, review r31: the stale
                # one was written back, an `unchecked` result lost, a first result undone)
                self._data[key] = _keep_origin(record, self._data.pop(key, None) or hit)  # (touched: same bytes)
                self._save()
            running[3].append(digest)
            return digest
        finally:
            with self._lock:
                if self._hashing.get(key) is running:
                    del self._hashing[key]
            running[2].set()

    def remember(self, file: Path, sha256: str, origin_url: str | None = None) -> None:
        """Record a hash computed elsewhere (a download hashes as it verifies; blocking), and
        where the file came from."""
        self.load()
        st = file.stat()
        record: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
        if origin_url:
            record["origin"] = origin_url
        with self._lock:
            key = str(file.resolve())
            self._data.pop(key, None)  # re-inserted last: the dict runs least recently hashed first
            self._data[key] = record
            self._save()
            if origin_url and (self._kept or self._unsaved) and not self._origin_said:
                self._origin_said = True  # (in memory only: lost if the node stops before a save works)
                log.warning("DIAG: a download's origin record is not saved yet (model_hashes.json %s): close the "
                            "program holding it; it is saved once the file can be read %s",
                            self._kept or "not written", kv(path=self.path, name=file.name))

    def set_public(self, file: Path, sha256: str, public: bool | None, *, sent_token: bool = True) -> bool:
        """Record whether a downloaded file's origin is public (None: the check could not be made,
        UNCHECKED, kept with `token`: whether the download sent a Hugging Face token, for the check
        made again), if its record still holds this sha256 (blocking); whether it was recorded."""
        self.load()
        with self._lock:
            key = str(file.resolve())
            hit = self._data.get(key)
            if not hit or hit.get("sha256") != sha256:
                return False
            self._data[key] = OriginRecord.from_json(hit).checked_as(public, sent_token=sent_token).merged_into(hit)
            self._save()
        return True

    def origin_of(self, file: Path, sha256: str | None = None) -> OriginRecord:
        """The file's origin record (blocking; none: not recorded, or its record holds another sha256
        than a given one)."""
        self.load()
        with self._lock:
            hit = self._data.get(str(file.resolve()))
        if not hit or (sha256 is not None and hit.get("sha256") != sha256):
            return OriginRecord()
        return OriginRecord.from_json(hit)

    def unchecked_of(self, file: Path, sha256: str) -> OriginRecord | None:
        """The origin record of a file whose origin check could not be made (UNCHECKED), or that was
        found public under an older rule than PUBLIC_RULE, if its record holds this sha256 (its
        `token_sent`: a record without `token`, written before 2026-12-07's fix, or public under an
        older rule, is asked without one); None otherwise (checked under this rule, not public, or an
        older record without `public`: not asked)."""
        origin = self.origin_of(file, sha256)
        return origin if origin.check_again else None

    def public_of(self, file: Path) -> bool:
        """Whether a file's recorded origin is public under this PUBLIC_RULE (an older record, without
        the flag, an UNCHECKED one, one found public under an older rule, one not readable: not)."""
        return self.origin_of(file).shared

    def stat_of(self, file: Path) -> tuple[int, int] | None:
        """(size, mtime_ns) of a file when its cached sha256 was computed (None: not cached)."""
        self.load()
        with self._lock:
            hit = self._data.get(str(file.resolve()))
        size, mtime_ns = (hit or {}).get("size"), (hit or {}).get("mtime_ns")
        return (size, mtime_ns) if isinstance(size, int) and isinstance(mtime_ns, int) else None

    def header_of(self, file: Path) -> tuple[str, int, str | None]:
        """(header sha256, header bytes, origin URL) of a file whose hash is cached (blocking):
        the header hash is computed once and kept in the same record."""
        self.load()
        key = str(file.resolve())
        with self._lock:
            hit = dict(self._data.get(key) or {})
        # kept only as written (a hash of 64 hex digits, an integer): else computed again (2026-12-07,
        # review r31: a header_bytes of "n/a" made the scan fail)
        if is_sha256(hit.get("header_sha256")) and is_int(hit.get("header_bytes")) and hit["header_bytes"] >= 0:
            return hit["header_sha256"], hit["header_bytes"], OriginRecord.from_json(hit).url
        digest, n_bytes = header_digest(file)
        with self._lock:
            record = self._data.get(key)
            if record is not None and record.get("sha256") == hit.get("sha256"):
                record.update(header_sha256=digest, header_bytes=n_bytes)
                self._save()
        return digest, n_bytes, OriginRecord.from_json(hit).url

    def _merge_kept(self) -> None:  # under self._lock
        """model_hashes.json was left as it was (not read, or damaged and not moved): read it again
        (once, no waiting); once it reads, its records join this run's (this run's win per file, a
        record of the same bytes keeps the origin on disk) and saving resumes. Until 2026-12-07
        (review r38) saving stayed off for the whole run: a download's origin record was lost."""
        assert self.path is not None
        disk, self._kept = _read(self.path, tries=1, quiet=True)
        if self._kept:
            return
        merged = dict(disk)  # disk's first: this run's records are the more recently hashed
        for key, cur in self._data.items():
            old = merged.pop(key, None)
            merged[key] = cur if old is None else _keep_origin(cur, old)
        self._data = merged
        _prune(self._data)  # (blocking: _save runs in executors)
        log.info("DIAG: model hash cache read again, saved from now on %s", kv(path=self.path, records=len(disk)))

    def _save(self) -> None:  # under self._lock
        if self.path is None:
            return
        if self._kept:
            self._merge_kept()
            if self._kept:
                return
        _bound(self._data)  # (a long run's downloads, each under a new name)
        try:  # fsynced, whole or not at all (write_atomic removes its .tmp when it fails)
            write_atomic(self.path, json.dumps(self._data, indent=1).encode("utf-8"))
        except OSError as exc:  # a full disk: the model is served all the same (this is only a cache)
            if not self._unsaved:  # said once, until a save works again
                log.warning("DIAG: model hash cache not saved, files will be hashed again at the next start %s",
                            kv(path=self.path, error=exc.strerror or exc))
            self._unsaved = True
            return
        self._unsaved = False
