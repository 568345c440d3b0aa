"""The first look at a model's origin for a partial model: its GGUF header, size, validator and the
sha256 the Hub states (`async_probe`), asked again when the answer broke off or the origin was busy
(`_async_probe_resuming`). fetch.py opens the partial model from it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

from node import const
from node.errors import DownloadFailed, ModelLoadError
from node.logs import kv
from node.models.download.fetch import Retryable, content_range, resume_validator, retry_delay
from node.models.download.hub import hub_headers, linked_sha256, refusal_hint, retry_after_s
from node.models.download.urls import describe_error, display_url, http_error, resolve_url
from node.models.gguf_meta import GgufHeader, read_header_bytes

log = logging.getLogger("node.models.partial.fetch")  # its lines are the fetch's, as before the split

PROBE_BYTES = 64 << 10  # the first request; more (doubling) while the header runs on
_CHUNK = 1 << 20


class _Retry(Retryable):
    """An attempt failed in a way another attempt (resuming) fixes (with the server's Retry-After)."""


@dataclass
class FetchStats:
    wire_bytes: int = 0  # every body byte read from the origin (gaps and skipped bytes included)
    wanted_bytes: int = 0  # the tensors' bytes this fetch had to get
    requests: int = 0
    attempts: int = 0
    restarts: int = 0  # the origin changed: everything fetched again


Probe = tuple[bytes, GgufHeader, int, "str | None", "str | None"]  # what async_probe read


async def async_probe(url: str, session: aiohttp.ClientSession, stats: FetchStats | None = None) -> Probe:
    """(header bytes, parse, file size, validator, the whole file's sha256 if the origin says it)."""
    resolved = resolve_url(url)
    buf = bytearray()
    want = PROBE_BYTES
    size: int | None = None
    validator = linked = None
    while True:
        before = len(buf)
        headers = {"Range": f"bytes={len(buf)}-{want - 1}", "Accept-Encoding": "identity",
                   **await asyncio.get_running_loop().run_in_executor(None, hub_headers, resolved)}
        if validator:
            headers["If-Range"] = validator
        async with session.get(resolved, headers=headers, auto_decompress=False) as resp:
            if stats is not None:
                stats.requests += 1
            if resp.status in (429, 500, 502, 503, 504):  # busy (the Hub's rate limit): asked again
                raise _Retry(http_error(resp.status), retry_after_s(resp.headers))
            if resp.status not in (200, 206):
                hint = "" if resp.history else refusal_hint(resolved, resp.status, "Authorization" in headers)
                raise DownloadFailed(f"{http_error(resp.status)} from {display_url(resolved)}{hint}")
            v = resume_validator(resp.headers)
            if validator and v != validator:
                buf.clear()  # changed between two probe requests: start the probe again
            validator = v
            if resp.status == 206:
                first, total = content_range(resp.headers.get("Content-Range"))
                if first != len(buf):
                    raise DownloadFailed(f"{display_url(resolved)} sent a range from byte {first}, asked {len(buf)}")
            else:
                buf.clear()
                total = resp.content_length
            size = total
            linked = linked_sha256(resp.history, resp.headers)  # the Hub's, on its redirect to the CDN
            while len(buf) < want:
                chunk = await resp.content.read(min(_CHUNK, want - len(buf)))
                if not chunk:
                    break
                buf += chunk
                if stats is not None:
                    stats.wire_bytes += len(chunk)
        if bytes(buf[:4]) != b"GGUF":
            raise DownloadFailed(f"{display_url(resolved)} is not a GGUF file (it starts with {bytes(buf[:16])!r})")
        if size is None:
            raise DownloadFailed(f"{display_url(resolved)} does not say the file's size (no Content-Range "
                                 "or Content-Length): layers cannot be fetched from it")
        try:
            header = await asyncio.get_running_loop().run_in_executor(None, read_header_bytes, bytes(buf),
                                                                      "origin header")
        except ModelLoadError as exc:
            if "truncated" not in exc.message:
                raise DownloadFailed(f"{display_url(resolved)}: {exc.message}") from exc
            header = None
        if header is not None and header.data_offset <= len(buf):
            return bytes(buf[:header.data_offset]), header, size, validator, linked
        if len(buf) >= min(size, const.MODEL_HEADER_MAX_BYTES) or len(buf) <= before:
            raise DownloadFailed(f"{display_url(resolved)}: no GGUF header within "
                                 f"{min(size, const.MODEL_HEADER_MAX_BYTES)} bytes")
        want = min(size, const.MODEL_HEADER_MAX_BYTES,
                   header.data_offset if header is not None else 2 * want)


async def _async_probe_resuming(url: str, session: aiohttp.ClientSession,
                                stats: FetchStats | None = None) -> tuple[bytes, GgufHeader, int, str | None, str | None]:
    """async_probe, asked again (backing off, up to DOWNLOAD_RETRIES) when the origin answered but
    its answer broke off, or it was busy (429, 5xx: at least its Retry-After, capped): one dropped
    connection or rate limit must not fail the open (a `--layers` node's start) as the fetch's never
    does. An origin that cannot be reached at all fails at once (the caller serves what is held, or
    opens the model later)."""
    for attempt in range(1, const.DOWNLOAD_RETRIES + 1):
        try:
            return await async_probe(url, session, stats)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, _Retry) as exc:
            if attempt >= const.DOWNLOAD_RETRIES:
                if isinstance(exc, _Retry):
                    raise DownloadFailed(f"{exc} from {display_url(resolve_url(url))} "
                                         f"({attempt} attempts)") from exc
                raise
            asked = exc.retry_after_s if isinstance(exc, _Retry) else None
            delay = max(retry_delay(attempt), asked or 0.0)
            log.info("DIAG: model header probe interrupted, asking again %s", kv(
                url=display_url(resolve_url(url)), attempt=attempt, retry_in_s=round(delay, 2),
                retry_after_s=asked, error=describe_error(exc)))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
