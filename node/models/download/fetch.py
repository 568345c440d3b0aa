"""One HTTP attempt of a download: from where the `.part` file ends, checked as it arrives.

The announced size against free disk space before anything is written; the GGUF magic in the first
bytes (a login or error page fails at once); a 206 that does not start where asked is thrown away;
bytes are written in 8 MB blocks on the download's own I/O thread, and what arrived before a
connection broke is kept for the next attempt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from node import const
from node.errors import DownloadFailed

from .hub import hub_headers, linked_sha256, refusal_hint, retry_after_s
from .job import DownloadJob
from .partfile import discard_part, resumable, size_or_zero, write_sidecar
from .urls import display_url, http_error

GGUF_MAGIC = b"GGUF"
_CHUNK = 1 << 20  # bytes per read from the socket
_FLUSH = 8 << 20  # bytes buffered before a write on the I/O thread


class Retryable(Exception):
    """An attempt failed in a way another attempt (resuming) can fix: 5xx, 429. `retry_after_s`: the
    server's Retry-After (capped), which the next attempt waits at least."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


async def async_fetch(session: aiohttp.ClientSession, job: DownloadJob, part: Path, io: concurrent.futures.Executor,
                      *, models_dir: Path, progress: Callable[[DownloadJob], None]) -> None:
    """One HTTP attempt: from the .part file's end if there is one. `io` is the download's own
    thread for file operations; `progress(job)` publishes state changes."""
    loop = asyncio.get_running_loop()
    have, if_range = await loop.run_in_executor(io, resumable, part, job.url)
    headers = {"Accept-Encoding": "identity",  # byte offsets must be the file's
               **await loop.run_in_executor(io, hub_headers, job.url)}  # the HF token, to the Hub only
    if have and if_range:
        headers.update({"Range": f"bytes={have}-", "If-Range": if_range})
    async with session.get(job.url, headers=headers) as resp:
        # the Hub's hash is on its redirect whatever the CDN answers: also a 416 (every byte already
        # here) is checked against it (2026-12-07: it was not, and a complete wrong .part was served)
        job.linked_sha256 = linked_sha256(resp.history, resp.headers) or job.linked_sha256
        if resp.status == 416 and have and content_range(resp.headers.get("Content-Range"))[1] == have:
            # an earlier attempt had every byte, or of another version of the same size, from a server
            # that ignores If-Range (2026-12-07: the older version was finished as the URL's file)
            named = resume_validator(resp.headers)  # (S3 and CloudFront name it; nginx does not)
            if named == if_range or named is None and await _async_same_version(session, job.url, headers, have,
                                                                                 if_range):
                job.total_bytes = job.done_bytes = have
                return
            await loop.run_in_executor(io, discard_part, part)
            raise Retryable(f"HTTP 416: the partial file ({have} bytes) is of another version than the file "
                            "there now; downloading it again from the start")
        if resp.status == 416 and have:  # the .part runs past the file there now (another, shorter version)
            await loop.run_in_executor(io, discard_part, part)  # kept, every later download would fail so
            raise Retryable(f"HTTP 416: the partial file ({have} bytes) is not of the file there now")
        if resp.status in (429, 500, 502, 503, 504):
            raise Retryable(http_error(resp.status), retry_after_s(resp.headers))
        if resp.status not in (200, 206):
            hint = "" if resp.history else \
                refusal_hint(str(resp.url), resp.status, "Authorization" in headers)  # the Hub's, not the CDN's
            raise DownloadFailed(f"{http_error(resp.status)} from {display_url(job.url)}{hint}",
                                 origin_status=resp.status)
        if resp.status == 206:
            first, total = content_range(resp.headers.get("Content-Range"))
            if first != have:  # not where we asked: start over rather than splice wrong bytes
                await loop.run_in_executor(io, discard_part, part)
                raise Retryable(f"server sent bytes from {first}, asked from {have}")
            if resume_validator(resp.headers) != if_range:  # a server ignoring If-Range: another version
                await loop.run_in_executor(io, discard_part, part)  # never spliced onto the old bytes
                raise Retryable(f"server sent a range of another version ({resume_validator(resp.headers)!r}, "
                                f"resumed {if_range!r})")
            offset = have
        else:  # a fresh start, or a server that ignores Range (or the file changed: If-Range)
            total = resp.content_length
            offset = 0
        head = b""
        if offset == 0:  # the file's first bytes, checked before the .part and its sidecar are touched
            # (2026-12-07: a login or proxy page answering a resume truncated the kept bytes, then
            # deleted them as "not a GGUF file"; now they stay as they were, to resume later)
            head = await _async_read_up_to(resp, len(GGUF_MAGIC))
            if head != GGUF_MAGIC:
                head += await _async_read_up_to(resp, 16 - len(head))
                kept = " (the partial file is kept as it was)" if have else ""
                raise DownloadFailed(f"{display_url(job.url)} is not a GGUF file (it starts with {head!r}: an HTML "
                                     f"page or an error?){kept}")
        if job.total_bytes is None or total is not None:
            job.total_bytes = total
        if job.state == "starting":  # the first answer with a body (not attempt 1: that may have been a 503)
            job.resumed_from = offset
        if total is not None:
            free = (await loop.run_in_executor(io, shutil.disk_usage, models_dir)).free
            # from zero (a changed file, a server ignoring Range): the kept .part is overwritten, its
            # bytes are room for the new ones (2026-12-07: not counted, such a restart was refused)
            freed = 0 if offset else await loop.run_in_executor(io, size_or_zero, part)
            if total - offset > free + freed:
                raise DownloadFailed(f"not enough disk space: {(total - offset) / 1e6:.0f} MB to download, "
                                     f"{free / 1e6:.0f} MB free in {models_dir}")
        # what a later attempt must present to resume: the same file, the same version
        await loop.run_in_executor(io, functools.partial(write_sidecar, part, job.url, resume_validator(resp.headers),
                                                         job.id, total=job.total_bytes, sha256=job.sha256,
                                                         named=job.set_named))
        fh = await loop.run_in_executor(io, open, part, "r+b" if offset else "wb")
        job.state, job.done_bytes = "downloading", offset + len(head)  # once the .part file is there
        job.fetched_bytes += len(head)
        progress(job)
        buf = bytearray(head)
        late: asyncio.TimerHandle | None = None
        try:
            if offset:
                await loop.run_in_executor(io, fh.truncate, offset)
                await loop.run_in_executor(io, fh.seek, offset)
            checked = offset == 0 or offset >= len(GGUF_MAGIC)  # (offset 0: the head, above)
            last_emit = 0.0

            def emit_late() -> None:
                nonlocal late, last_emit
                late, last_emit = None, time.monotonic()
                progress(job)

            async for chunk in resp.content.iter_chunked(_CHUNK):
                buf += chunk
                job.done_bytes += len(chunk)
                job.fetched_bytes += len(chunk)
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
                    progress(job)
                elif late is None:  # the bytes of a burst before a stall are shown, not left unsaid
                    late = loop.call_later(const.DOWNLOAD_PROGRESS_S - (now - last_emit), emit_late)
            if buf and not checked and bytes(buf[:4]) != GGUF_MAGIC:
                raise DownloadFailed(f"{display_url(job.url)} is not a GGUF file", discard=True)
        finally:
            if late is not None:
                late.cancel()
            # what arrived is kept even when the connection broke: the next attempt resumes after it
            if buf:
                data = bytes(buf)
                buf.clear()
                await loop.run_in_executor(io, fh.write, data)
            await loop.run_in_executor(io, fh.close)
        if job.total_bytes is not None and job.done_bytes < job.total_bytes:
            raise aiohttp.ClientPayloadError(f"connection ended at {job.done_bytes} of {job.total_bytes} bytes")


async def _async_same_version(session: aiohttp.ClientSession, url: str, headers: dict[str, str], have: int,
                              if_range: str | None) -> bool:
    """Whether a `.part` of `have` bytes answered 416 is the file at `url` now: its last byte asked
    under If-Range comes back as a 206 naming the version resumed (a 200, or a 206 naming another: a
    changed file). Retryable when the origin answers neither."""
    ask = {**headers, "Range": f"bytes={have - 1}-{have - 1}"}
    async with session.get(url, headers=ask) as resp:
        if resp.status == 200:
            return False
        if resp.status != 206:
            raise Retryable(f"{http_error(resp.status)} confirming the version of the partial file",
                            retry_after_s(resp.headers))
        return content_range(resp.headers.get("Content-Range")) == (have - 1, have) \
            and resume_validator(resp.headers) == if_range


async def _async_read_up_to(resp: aiohttp.ClientResponse, n: int) -> bytes:
    """Up to n bytes of the body (fewer only at its end)."""
    got = b""
    while len(got) < n and (more := await resp.content.read(n - len(got))):
        got += more
    return got


def retry_delay(attempt: int) -> float:
    """Seconds before retry number `attempt` (1, 2, ...) of a download or a fetch: doubling from
    DOWNLOAD_RETRY_BASE_S, at most 30 s."""
    return min(30.0, const.DOWNLOAD_RETRY_BASE_S * 2 ** (attempt - 1))


def resume_validator(headers: Any) -> str | None:
    """What If-Range can use: a strong ETag, else Last-Modified (a weak ETag never matches If-Range)."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return headers.get("Last-Modified")


def content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, total) of a Content-Range header (`bytes 10-99/100`, `bytes */100`)."""
    m = re.fullmatch(r"bytes (?:(\d+)-\d+|\*)/(\d+)", (value or "").strip())
    if not m:
        return None, None
    return (int(m.group(1)) if m.group(1) is not None else None), int(m.group(2))
