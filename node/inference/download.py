"""Model downloads: a GGUF from a URL (or `hf://owner/repo/file.gguf`) into `data_dir/models/`.

A download streams into `<name>.gguf.part` and resumes it with a `Range` request after a dropped
connection (DOWNLOAD_RETRIES attempts, backing off); a server that ignores `Range` restarts it from
zero. It checks the free disk space against the announced size before it starts, the GGUF magic in
the first bytes (a login page or an error page is refused at once, not after gigabytes), the size at
the end, and the sha256 when one was given. Only then is the file renamed into `models/`, scanned
into the catalog and registered, so it shows up in /api/admin/models and the GUI and can be loaded.
Writes, hashing and renames run in an executor (the loop never blocks); progress is published to
observers at most DOWNLOAD_PROGRESS_S apart. URLs are logged without their query string (signed
URLs carry credentials there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from node import const
from node.errors import Conflict, InvalidRequest, NodeError, NotFound
from node.logs import kv

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_CHUNK = 1 << 20  # bytes per read from the socket
_FLUSH = 8 << 20  # bytes buffered before a write in the executor
_HF_BASE = "https://huggingface.co"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\.gguf$")

_RESERVED_NAMES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}

DownloadObserver = Callable[["DownloadJob"], None]


class DownloadFailed(NodeError):
    """The download could not complete (network, HTTP status, content, size, hash, disk).
    `discard`: what is on disk is wrong, not merely incomplete (the .part goes)."""

    http_status = 502
    error_type = "download_error"
    code = "download_failed"

    def __init__(self, message: str, *, discard: bool = False):
        super().__init__(message)
        self.discard = discard


class _Retryable(Exception):
    """An attempt failed in a way another attempt (resuming) can fix: 5xx, 429."""


def resolve_url(url: str) -> str:
    """The HTTP(S) URL to fetch: `hf://owner/repo/path/file.gguf[@revision]` becomes Hugging Face's
    resolve URL; http(s) URLs pass; anything else is an InvalidRequest."""
    if url.startswith("hf://"):
        spec = url[len("hf://"):]
        spec, _, revision = spec.partition("@")
        parts = [p for p in spec.split("/") if p]
        if len(parts) < 3:
            raise InvalidRequest("hf:// URLs are hf://owner/repo/path/to/file.gguf[@revision]", param="url")
        owner, repo, path = parts[0], parts[1], "/".join(parts[2:])
        quoted = "/".join(urllib.parse.quote(p) for p in (owner, repo))
        return f"{_HF_BASE}/{quoted}/resolve/{urllib.parse.quote(revision or 'main')}/{urllib.parse.quote(path)}"
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InvalidRequest("url must be http(s)://… or hf://owner/repo/file.gguf", param="url")
    return url


def display_url(url: str) -> str:
    """The URL without query string or fragment (signed URLs carry credentials there)."""
    parsed = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parsed.scheme, parsed.hostname or "", parsed.path, "", "")) \
        if not parsed.port else urllib.parse.urlunsplit((parsed.scheme, f"{parsed.hostname}:{parsed.port}",
                                                          parsed.path, "", ""))


def file_name_for(url: str, name: str | None) -> str:
    """The file name in models/: the given one, else the URL's last path segment."""
    candidate = name or urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not candidate.endswith(".gguf"):
        candidate += ".gguf"
    if not _NAME_OK.match(candidate) or candidate.startswith("..") or \
            candidate.split(".")[0].upper() in _RESERVED_NAMES:
        raise InvalidRequest(f"cannot use {candidate!r} as a model file name (letters, digits, . _ + - and "
                             "a .gguf suffix)", param="filename")
    return candidate


@dataclass
class DownloadJob:
    """One download, as the API, the CLI and the GUI see it."""

    id: str
    url: str  # resolved; never shown whole (display_url)
    file_name: str
    sha256: str | None = None
    state: str = "starting"  # starting | downloading | verifying | done | failed | cancelled
    total_bytes: int | None = None
    done_bytes: int = 0
    attempts: int = 0
    resumed_from: int = 0  # bytes kept from an earlier attempt (Range)
    error: str | None = None
    model_id: str | None = None
    user_cancelled: bool = False
    stop: threading.Event = field(default_factory=threading.Event, repr=False)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.state in ("starting", "downloading", "verifying")

    def summary(self) -> dict[str, Any]:
        elapsed = (self.finished_at or time.time()) - self.started_at
        fetched = self.done_bytes - self.resumed_from
        return {
            "id": self.id, "url": display_url(self.url), "file": self.file_name, "state": self.state,
            "total_bytes": self.total_bytes, "done_bytes": self.done_bytes,
            "progress": round(self.done_bytes / self.total_bytes, 4) if self.total_bytes else None,
            "mb_per_s": round(fetched / 1e6 / elapsed, 2) if elapsed > 0 else None,
            "attempts": self.attempts, "error": self.error, "model_id": self.model_id,
        }


class ModelDownloader:
    """Runs downloads into `models_dir`; `on_file(path, sha256)` adds a finished file to the node
    and returns its model id."""

    def __init__(self, models_dir: Path, on_file: Callable[[Path, str], Awaitable[str]]):
        self.models_dir = models_dir
        self.on_file = on_file
        self.jobs: dict[str, DownloadJob] = {}
        self._observers: list[DownloadObserver] = []

    def subscribe(self, observer: DownloadObserver) -> Callable[[], None]:
        self._observers.append(observer)
        return lambda: self._observers.remove(observer) if observer in self._observers else None

    def _emit(self, job: DownloadJob) -> None:
        for observer in list(self._observers):
            try:
                observer(job)
            except Exception:
                log.exception("download observer failed")

    def start(self, url: str, *, sha256: str | None = None, file_name: str | None = None) -> DownloadJob:
        """Start a download (loop); the same file already downloading is that job, not a second."""
        resolved = resolve_url(url)
        name = file_name_for(resolved, file_name)
        if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
            raise InvalidRequest("sha256 must be 64 hex digits", param="sha256")
        for job in self.jobs.values():
            if job.file_name.lower() == name.lower() and job.active:  # one .part per name on any filesystem
                if job.url != resolved:
                    raise Conflict(f"{name} is already being downloaded from another URL")
                return job
        if (self.models_dir / name).exists():
            raise Conflict(f"models/{name} already exists; remove it first or choose another filename")
        job = DownloadJob(hashlib.sha256(f"{resolved}\0{time.time_ns()}".encode()).hexdigest()[:12], resolved, name,
                          sha256.lower() if sha256 else None)
        self.jobs[job.id] = job
        job.task = asyncio.get_running_loop().create_task(self._async_run(job), name=f"download-{job.id}")
        job.task.add_done_callback(lambda _task: self._settle(job))
        return job

    def get(self, job_id: str) -> DownloadJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no download {job_id}")
        return job

    def cancel(self, job_id: str) -> DownloadJob:
        job = self.get(job_id)
        if job.active and job.task is not None:
            job.user_cancelled = True
            job.task.cancel()
        return job

    async def async_close(self) -> None:
        """Cancel running downloads (their .part files stay, so a new download of the same file resumes)."""
        tasks = [job.task for job in self.jobs.values() if job.task is not None and not job.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one download -------------------------------------------------------------------------

    async def _async_run(self, job: DownloadJob) -> None:
        loop = asyncio.get_running_loop()
        part = self.models_dir / (job.file_name + ".part")
        started = time.monotonic()
        # one thread for this download's file operations: they happen in order, and a write still
        # running when the task is cancelled finishes before the file is closed
        io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"download-{job.id}")
        log.info("DIAG: model download started %s", kv(download=job.id, url=display_url(job.url), file=job.file_name))
        try:
            await loop.run_in_executor(io, lambda: self.models_dir.mkdir(parents=True, exist_ok=True))
            timeout = aiohttp.ClientTimeout(total=None, connect=const.DOWNLOAD_CONNECT_TIMEOUT_S,
                                            sock_read=const.DOWNLOAD_READ_TIMEOUT_S)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while True:
                    job.attempts += 1
                    try:
                        await self._async_fetch(session, job, part, io)
                        break
                    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError, _Retryable) as exc:
                        error = _describe(exc)
                        if job.attempts >= const.DOWNLOAD_RETRIES:
                            kept = " (the partial file is kept: downloading it again resumes)" \
                                if await loop.run_in_executor(io, _size_or_zero, part) else ""
                            raise DownloadFailed(f"failed {job.attempts} times; last: {error}{kept}") from exc
                        delay = min(30.0, const.DOWNLOAD_RETRY_BASE_S * 2 ** (job.attempts - 1))
                        log.info("DIAG: model download interrupted, resuming %s", kv(
                            download=job.id, done_bytes=job.done_bytes, attempt=job.attempts,
                            retry_in_s=delay, error=error))
                        await asyncio.sleep(delay)
            job.state = "verifying"
            self._emit(job)
            size, digest = await loop.run_in_executor(io, _size_and_sha256, part, job.stop)
            if job.total_bytes is not None and size != job.total_bytes:
                raise DownloadFailed(f"got {size} bytes, the server announced {job.total_bytes}", discard=True)
            if job.sha256 is not None and digest != job.sha256:
                raise DownloadFailed(f"sha256 mismatch: expected {job.sha256}, got {digest} (file removed)",
                                     discard=True)
            target = self.models_dir / job.file_name
            await loop.run_in_executor(io, os.replace, part, target)
            await loop.run_in_executor(io, _unlink, _sidecar(part))
            job.model_id = await self.on_file(target, digest)
            job.state = "done"
            job.finished_at = time.time()
            elapsed = time.monotonic() - started
            log.info("DIAG: model download complete %s", kv(
                download=job.id, model=job.model_id, bytes=size, elapsed_s=round(elapsed, 1),
                mb_per_s=round((size - job.resumed_from) / 1e6 / max(elapsed, 1e-6), 2), sha256=digest[:16]))
        except asyncio.CancelledError:
            job.stop.set()  # a hash in progress stops
            try:
                if job.user_cancelled:  # the user said no: nothing of it stays (at shutdown the .part
                    await loop.run_in_executor(io, _discard_part, part)  # stays: the same download resumes)
            finally:  # "cancelled" only once the files are gone: a client polling the job can rely on it
                job.state, job.error, job.finished_at = "cancelled", "cancelled", time.time()
                log.info("DIAG: model download cancelled %s", kv(download=job.id, done_bytes=job.done_bytes))
            raise
        except DownloadFailed as exc:
            if exc.discard:  # what is on disk is wrong (not a GGUF, bad hash): nothing of it stays
                await loop.run_in_executor(io, _discard_part, part)
            self._fail(job, exc.message)
        except NodeError as exc:
            self._fail(job, exc.message)
        except aiohttp.ClientError as exc:  # redirects, bad URLs: their text may hold a signed URL
            self._fail(job, f"{type(exc).__name__} fetching {display_url(job.url)}")
        except OSError as exc:  # disk full, permissions
            self._fail(job, f"{type(exc).__name__}: {exc.strerror or exc}")
        except Exception as exc:  # a bug must end in a failed job, never a stuck one
            log.error("model download %s failed unexpectedly: %s", job.id, type(exc).__name__)
            self._fail(job, f"internal error: {type(exc).__name__}")
        finally:
            io.shutdown(wait=False)
            self._emit(job)

    def _settle(self, job: DownloadJob) -> None:
        """The job's task ended: a task cancelled before it ever ran must not leave the job active."""
        if job.active:
            job.state, job.error, job.finished_at = "cancelled", "cancelled before it started", time.time()
            self._emit(job)

    def _fail(self, job: DownloadJob, message: str) -> None:
        job.state, job.error, job.finished_at = "failed", message, time.time()
        log.warning("DIAG: model download failed %s", kv(download=job.id, url=display_url(job.url), error=message))

    async def _async_fetch(self, session: aiohttp.ClientSession, job: DownloadJob, part: Path,
                           io: concurrent.futures.Executor) -> None:
        """One HTTP attempt: from the .part file's end if there is one."""
        loop = asyncio.get_running_loop()
        have, validator = await loop.run_in_executor(io, _resumable, part, job.url)
        headers = {"Accept-Encoding": "identity"}  # byte offsets must be the file's
        if have and validator:
            headers.update({"Range": f"bytes={have}-", "If-Range": validator})
        async with session.get(job.url, headers=headers) as resp:
            if resp.status == 416 and have and _content_range(resp.headers.get("Content-Range"))[1] == have:
                job.total_bytes = job.done_bytes = have  # an earlier attempt already had every byte
                return
            if resp.status in (429, 500, 502, 503, 504):
                raise _Retryable(f"HTTP {resp.status} {resp.reason or ''}".strip())
            if resp.status not in (200, 206):
                raise DownloadFailed(f"HTTP {resp.status} {resp.reason or ''} from {display_url(job.url)}".strip())
            if resp.status == 206:
                first, total = _content_range(resp.headers.get("Content-Range"))
                if first != have:  # not where we asked: start over rather than splice wrong bytes
                    await loop.run_in_executor(io, _discard_part, part)
                    raise _Retryable(f"server sent bytes from {first}, asked from {have}")
                offset = have
            else:  # a fresh start, or a server that ignores Range (or the file changed: If-Range)
                total = resp.content_length
                offset = 0
            if job.total_bytes is None or total is not None:
                job.total_bytes = total
            if job.attempts == 1:
                job.resumed_from = offset
            if total is not None:
                free = (await loop.run_in_executor(io, shutil.disk_usage, self.models_dir)).free
                if total - offset > free:
                    raise DownloadFailed(f"not enough disk space: {(total - offset) / 1e6:.0f} MB to download, "
                                         f"{free / 1e6:.0f} MB free in {self.models_dir}")
            job.state, job.done_bytes = "downloading", offset
            self._emit(job)
            # what a later attempt must present to resume: the same file, the same version
            await loop.run_in_executor(io, _write_sidecar, part, job.url, _validator(resp.headers))
            fh = await loop.run_in_executor(io, open, part, "r+b" if offset else "wb")
            buf = bytearray()
            try:
                if offset:
                    await loop.run_in_executor(io, fh.truncate, offset)
                    await loop.run_in_executor(io, fh.seek, offset)
                checked = offset >= len(GGUF_MAGIC)
                last_emit = 0.0
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    buf += chunk
                    job.done_bytes += len(chunk)
                    if not checked and len(buf) >= len(GGUF_MAGIC):
                        if bytes(buf[:4]) != GGUF_MAGIC:
                            raise DownloadFailed(f"{display_url(job.url)} is not a GGUF file (it starts with "
                                                 f"{bytes(buf[:16])!r}: an HTML page or an error?)", discard=True)
                        checked = True
                    if len(buf) >= _FLUSH:
                        data = bytes(buf)
                        buf.clear()  # before the await: a cancelled write still lands, exactly once
                        await loop.run_in_executor(io, fh.write, data)
                    now = time.monotonic()
                    if now - last_emit >= const.DOWNLOAD_PROGRESS_S:
                        last_emit = now
                        self._emit(job)
                if buf and not checked and bytes(buf[:4]) != GGUF_MAGIC:
                    raise DownloadFailed(f"{display_url(job.url)} is not a GGUF file", discard=True)
            finally:
                # what arrived is kept even when the connection broke: the next attempt resumes after it
                if buf:
                    data = bytes(buf)
                    buf.clear()
                    await loop.run_in_executor(io, fh.write, data)
                await loop.run_in_executor(io, fh.close)
            if job.total_bytes is not None and job.done_bytes < job.total_bytes:
                raise aiohttp.ClientPayloadError(f"connection ended at {job.done_bytes} of {job.total_bytes} bytes")


_QUERY = re.compile(r"[?#][^\s'\")>]*")


def _describe(exc: BaseException) -> str:
    """An attempt's error for logs and the job: type and text, never a URL's query string."""
    text = _QUERY.sub("?…", str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _validator(headers: Any) -> str | None:
    """What If-Range can use: a strong ETag, else Last-Modified (a weak ETag never matches If-Range)."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return headers.get("Last-Modified")


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, total) of a Content-Range header (`bytes 10-99/100`, `bytes */100`)."""
    m = re.fullmatch(r"bytes (?:(\d+)-\d+|\*)/(\d+)", (value or "").strip())
    if not m:
        return None, None
    return (int(m.group(1)) if m.group(1) is not None else None), int(m.group(2))


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _sidecar(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _discard_part(part: Path) -> None:
    part.unlink(missing_ok=True)
    _sidecar(part).unlink(missing_ok=True)


def _write_sidecar(part: Path, url: str, validator: str | None) -> None:
    # the URL without its query: no credentials on disk, and a fresh signed URL of the same file
    # still resumes (If-Range guards the version)
    _sidecar(part).write_text(json.dumps({"url": display_url(url), "validator": validator}), encoding="utf-8")


def _resumable(part: Path, url: str) -> tuple[int, str | None]:
    """(bytes to keep, If-Range value) for a .part file left by an earlier attempt or download of
    the same URL; (0, None) when there is none, or it came from elsewhere or without a validator
    (then it is overwritten)."""
    have = _size_or_zero(part)
    if not have:
        return 0, None
    try:
        meta = json.loads(_sidecar(part).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0, None
    if not isinstance(meta, dict) or meta.get("url") != display_url(url) or not meta.get("validator"):
        return 0, None
    return have, str(meta["validator"])


def _size_and_sha256(path: Path, stop: threading.Event) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            if stop.is_set():
                raise InterruptedError("download cancelled while hashing")
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()
