"""Layers of a model fetched from its origin by HTTP Range requests, into a partial model.

`async_open_partial(url, directory)` probes the origin: the first MiB (more while the header runs
on, up to MODEL_HEADER_MAX_BYTES), the file's size from `Content-Range` and its validator (strong
ETag, else Last-Modified); the tensor table must fit that size before anything is trusted. An
existing directory of the same URL and header is reused. `async_fetch_parts(store, manifest,
parts)` then fetches exactly the missing tensors of those parts: runs separated by at most
PARTIAL_COALESCE_GAP bytes go in one request `Range: bytes=a-b` with `If-Range: <validator>`.
What arrived is written to the part files on one I/O thread and recorded per tensor
(`fetch.json`) every PARTIAL_STATE_EVERY bytes and when an attempt ends, so a dropped connection
resumes where the bytes stopped (nothing fetched twice). Answers:

- 206 from the asked byte, total = the known size: streamed in.
- 206 elsewhere (a wrong range): retried.
- fewer bytes than asked (a truncated range, a dropped connection): retried from where it ended.
- 200 with another validator (If-Range: the file changed), or a 206 of another total: every part
  of the old version is dropped and the header probed again; the same header restarts the
  fetch from zero, another one fails (the model this node named is gone from that URL).
  A manifest with no validator yet (made from the swarm's header, fromheader.py) meeting its
  origin's first one is no change: the same file (header, size, the whole-file sha256 where the
  origin states one) has that validator recorded and every part held kept; another file fails
  the fetch, nothing removed.
- 200 with the same validator: the server ignores Range; the file is read through once from
  byte 0, keeping only the wanted tensors' bytes, and the connection dropped after the last.
- 5xx / 429 retried (DOWNLOAD_RETRIES, backing off), other statuses fail.

A part is complete when every byte of its tensors is here; its tensors are then hashed (sha256,
on the I/O thread) into the manifest. Later loads check a part against those hashes
(`PartialStore.verify`): a corrupt byte quarantines the part and it is fetched again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import aiohttp

from node import const
from node.errors import DownloadFailed, ModelLoadError
from node.logs import kv
from node.models.download.fetch import Retryable, content_range, resume_validator, retry_delay
from node.models.download.hub import hub_headers, refusal_hint, retry_after_s
from node.models.download.urls import cert_failure, describe_error, display_url, http_error, resolve_url

from .layout import Manifest, PartialStore, new_manifest
from .probe import FetchStats, Probe, _async_probe_resuming, _Retry
from .session import origin_session, rebound

log = logging.getLogger(__name__)

_CHUNK = 1 << 20

Progress = Callable[[int, int], None]  # (bytes received of the wanted, bytes wanted)


class _OriginChanged(Exception):
    """The file at the URL is another version than the one being fetched."""


def _timeout() -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, connect=const.DOWNLOAD_CONNECT_TIMEOUT_S,
                                 sock_read=const.DOWNLOAD_READ_TIMEOUT_S)


async def async_open_partial(url: str, directory: Path, *, sha256: str | None = None,
                             session: aiohttp.ClientSession | None = None,
                             forget: Callable[[str], object] | None = None,
                             probed: Probe | None = None) -> tuple[PartialStore, Manifest]:
    """The partial model of `url` in `directory`: the one there if it is of the same URL, header
    and size (also when the origin cannot be probed now: it serves what it holds), else a new one
    holding nothing yet but the `globals` part (the header probed from the origin). `forget(model
    sha256)` (blocking, on an executor): another version of the same header is at the URL, whose
    derived id is the old one's, so what was computed from the old bytes (the weight cache's
    conversions) must go; called before the new validator is recorded. `probed`: the origin's probe
    the caller has just read (not asked again)."""
    loop = asyncio.get_running_loop()
    store = PartialStore(directory)
    origin = display_url(resolve_url(url))
    old = await loop.run_in_executor(None, _existing, store, origin)
    own = session is None and probed is None
    session = session or (origin_session(_timeout()) if own else None)
    try:
        if probed is not None:
            data, header, size, validator, linked = probed
        else:
            probe = _async_probe_resuming(url, session)
            if old is not None:  # layers here: an origin that hangs must not hold the node's start for a minute
                probe = asyncio.wait_for(probe, const.PARTIAL_HELD_PROBE_S)
            data, header, size, validator, linked = await probe
    except (aiohttp.ClientError, TimeoutError, DownloadFailed) as exc:
        failed = exc if isinstance(exc, DownloadFailed) else \
            DownloadFailed(f"probing {origin} failed: {describe_error(exc)}")
        if old is None:
            raise failed from exc
        log.warning("DIAG: model origin unreachable, serving the layers held %s",
                    kv(url=origin, held=old.describe(), error=failed.message))
        return store, old
    finally:
        if own:
            await session.close()
    if validator is None:  # then a file replaced by another of the same header and size goes unseen
        log.warning("DIAG: model origin names no version (no ETag, no Last-Modified): a change of the file "
                    "there cannot be detected, and layers of two versions could mix %s", kv(url=origin))
    fresh = await loop.run_in_executor(None, lambda: new_manifest(
        header, data, origin_url=origin, validator=validator, size_bytes=size,
        sha256=sha256.lower() if sha256 else linked))
    if old is not None and (old.header_sha256, old.size_bytes) == (fresh.header_sha256, size):
        manifest = old
        if old.validator is None and validator is not None:  # made from the swarm's header: a first version
            # the swarm's file replaced in place, or an origin stating no sha256 for it: kept, unvouched
            if (linked is not None or old.whole_sha256) and linked != old.sha256:
                log.warning("DIAG: model origin answers for another file, serving the layers held %s",
                            kv(url=origin, model=old.sha256[:16], origin_sha256=(linked or "")[:16] or None, held=old.describe()))
                return store, old
            old.validator = validator  # the parts held (peers', unchecked) stay until a spot check
            await loop.run_in_executor(None, store.save, old)
        elif old.validator != validator:  # same header, another version: nothing fetched is kept
            if forget is not None:
                await loop.run_in_executor(None, forget, old.sha256)
            await loop.run_in_executor(None, store.remove_parts, old, sorted({t.part for t in old.tensors.values()}))
            await loop.run_in_executor(None, store.save_fetch_state, None, {})
            old.validator = validator
            await loop.run_in_executor(None, store.save, old)
    else:
        await loop.run_in_executor(None, store.create, fresh, data, header)
        log.info("DIAG: partial model created %s", kv(url=origin, model=fresh.sha256[:16],
                                                      size_mb=round(size / 1e6, 1), n_layers=fresh.n_layers))
        manifest = fresh
    if any(t.part == "globals" for t in manifest.tensors.values()) and "globals" not in manifest.complete:
        # rope factors and the like: tiny, and read by the model's configuration (budgets, shapes)
        await async_fetch_parts(store, manifest, ["globals"], url=url, forget=forget)
    return store, manifest


def _existing(store: PartialStore, origin: str) -> Manifest | None:
    """The manifest in the store's directory if it is a partial model of this origin (blocking)."""
    if not store.is_partial(store.dir):
        return None
    try:
        manifest = store.load()
    except ModelLoadError:
        return None
    return manifest if manifest.origin_url == origin else None


def _coalesce(spans: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class _Writer:
    """Routes origin bytes to the part files; blocking methods run on the fetch's I/O thread."""

    def __init__(self, store: PartialStore, manifest: Manifest, names: list[str], have: dict[str, int]):
        self.store, self.manifest = store, manifest
        self.tensors = sorted((manifest.tensors[n] for n in names), key=lambda t: t.offset)
        self.have = have
        self.files: dict[str, IO[bytes]] = {}
        self.read_through = False  # the origin ignored Range once (logged once)

    def received(self) -> int:
        """Bytes of this fetch's tensors here so far."""
        return sum(min(self.have.get(t.name, 0), t.n_bytes) for t in self.tensors)

    def spans(self) -> list[tuple[int, int]]:
        return [(t.offset + self.have.get(t.name, 0), t.offset + t.n_bytes)
                for t in self.tensors if self.have.get(t.name, 0) < t.n_bytes]

    def _file(self, part: str) -> IO[bytes]:
        fh = self.files.get(part)
        if fh is None:
            path = self.store.part_path(part)
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(path, "r+b" if path.exists() else "w+b")
            self.files[part] = fh
        return fh

    def write(self, pos: int, data: bytes) -> int:
        """Bytes at origin offset `pos`: the wanted ones land in their part files, only where they
        extend what a tensor already has (contiguous). Returns the wanted bytes taken."""
        end, taken = pos + len(data), 0
        for t in self.tensors:
            if t.offset >= end:
                break
            got = self.have.get(t.name, 0)
            a = max(pos, t.offset + got)
            b = min(end, t.offset + t.n_bytes)
            if a >= b or a != t.offset + got:
                continue
            fh = self._file(t.part)
            fh.seek(t.local + (a - t.offset))
            fh.write(data[a - pos:b - pos])
            self.have[t.name] = got + (b - a)
            taken += b - a
        return taken

    def checkpoint(self) -> None:
        for fh in self.files.values():  # the bytes are on disk before the count that says so
            fh.flush()
            os.fsync(fh.fileno())
        self.store.save_fetch_state(self.manifest.validator, self.have)

    def close(self) -> None:
        try:
            self.checkpoint()
        finally:
            for fh in self.files.values():
                fh.close()
            self.files.clear()

    def finish_parts(self, expected: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
        """Hash every part whose tensors are all here and mark it complete. `expected` (tensor ->
        sha256, bytes from a peer): a part whose bytes hash otherwise is quarantined instead, its
        bytes counted as missing. Returns (the parts completed, the parts quarantined)."""
        done, bad = [], []
        for part in sorted({t.part for t in self.tensors}):
            ts = self.manifest.part_tensors(part)
            if part in self.manifest.complete or any(self.have.get(t.name, 0) < t.n_bytes for t in ts):
                continue
            digests = self.store.hash_part(self.manifest, part)
            for t in ts:
                self.have.pop(t.name, None)
            if expected is not None and any(digests[t.name] != expected.get(t.name) for t in ts):
                self.store.quarantine(self.manifest, part)
                bad.append(part)
                continue
            for t in ts:
                t.sha256 = digests[t.name]
            if expected is not None:  # a peer's: unchecked until the origin vouches (peers.py)
                self.manifest.mark_unchecked([part])
            self.manifest.mark_complete(part)
            done.append(part)
        self.store.save(self.manifest)
        self.store.save_fetch_state(self.manifest.validator, self.have)
        return done, bad


async def async_fetch_parts(store: PartialStore, manifest: Manifest, parts: list[str], *,
                            url: str | None = None, progress: Progress | None = None,
                            session: aiohttp.ClientSession | None = None,
                            forget: Callable[[str], object] | None = None) -> FetchStats:
    """Fetch the missing tensors of `parts` from the manifest's origin (see the module doc).
    `url`: the origin as given, with its query (a signed URL's credentials are never stored: the
    manifest holds the URL without them); default the manifest's. `forget`: as async_open_partial's,
    called when the origin changed, before the new validator is recorded (a fetch cancelled or
    killed after that must not leave the old version's conversions to the next load)."""
    loop = asyncio.get_running_loop()
    url = resolve_url(url or manifest.origin_url)
    if display_url(url) != manifest.origin_url:
        raise DownloadFailed(f"{display_url(url)} is not this partial model's origin {manifest.origin_url}")
    stats = FetchStats()
    io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="partial-fetch")
    own = session is None
    session = session or origin_session(_timeout())
    started = time.monotonic()
    try:
        bad = await loop.run_in_executor(io, store.verify, manifest, parts)
        for part in bad:
            log.warning("DIAG: partial model part corrupt, quarantined and fetched again %s",
                        kv(model=manifest.sha256[:16], part=part))
        spurious = 0  # answers that were not the file while the origin's version stayed the same
        while True:
            try:
                await _async_fetch_version(store, manifest, parts, url, session, io, stats, progress)
                break
            except _OriginChanged as exc:
                # the origin says first whether it is another version: an answer that is not the
                # file (an error page or a proxy's reply with a 200) must not cost the parts held
                data, _header, size, validator, linked = await _async_probe_resuming(url, session, stats)
                same_model = hashlib.sha256(data).hexdigest() == manifest.header_sha256 and size == manifest.size_bytes
                if manifest.validator is None and validator is not None:
                    # never validated (made from the swarm's header, fromheader.py): a first version is
                    # no change, and the parts held (peers', unchecked) are the swarm's file's
                    await _async_first_version(store, manifest, io, same_model, validator, linked)
                    continue
                if same_model and validator == manifest.validator:
                    spurious += 1
                    if spurious > 2:
                        raise DownloadFailed(f"{manifest.origin_url} answers ranges with something other than "
                                             f"the file ({exc}); the file itself is unchanged") from exc
                    log.warning("DIAG: model origin answered a range with something other than the file, "
                                "trying again %s", kv(url=manifest.origin_url, reason=str(exc)))
                    await asyncio.sleep(retry_delay(spurious))
                    continue
                stats.restarts += 1
                if stats.restarts > 2:
                    raise DownloadFailed(f"{manifest.origin_url} keeps changing while its layers are fetched") from exc
                log.warning("DIAG: model origin changed, fetching again from zero %s",
                            kv(url=manifest.origin_url, reason=str(exc)))
                if forget is not None:
                    await loop.run_in_executor(io, forget, manifest.sha256)
                await loop.run_in_executor(io, store.remove_parts, manifest,
                                           sorted({t.part for t in manifest.tensors.values()}))
                await loop.run_in_executor(io, store.save_fetch_state, None, {})
                if not same_model:
                    raise DownloadFailed(f"the file at {manifest.origin_url} changed: its header or size is "
                                         "not the model's any more") from exc
                manifest.validator = validator
                await loop.run_in_executor(io, store.save, manifest)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DownloadFailed(f"fetching layers from {manifest.origin_url} failed: {describe_error(exc)}") from exc
    except OSError as exc:  # disk full, permissions: the slice load fails with the reason
        raise DownloadFailed(f"writing layers of {manifest.origin_url} failed: "
                             f"{type(exc).__name__}: {exc.strerror or exc}") from exc
    finally:
        if own:
            await session.close()
        io.shutdown(wait=False)  # a hash still running on a cancel ends on its own
    log.info("DIAG: partial model parts fetched %s", kv(
        model=manifest.sha256[:16], parts=len(parts), wanted_mb=round(stats.wanted_bytes / 1e6, 1),
        wire_mb=round(stats.wire_bytes / 1e6, 1), requests=stats.requests, attempts=stats.attempts,
        elapsed_s=round(time.monotonic() - started, 1), held=manifest.describe()))
    return stats


async def _async_first_version(store: PartialStore, manifest: Manifest, io: concurrent.futures.Executor,
                               same_model: bool, validator: str, linked: str | None) -> None:
    """A manifest with no validator meets its origin's first: recorded when the origin holds the
    same file (header, size, and whole-file sha256 where it states one; it must for a whole-file id),
    nothing removed (the parts held stay unchecked until a spot check); else DownloadFailed, nothing
    removed either."""
    if not same_model or ((linked is not None or manifest.whole_sha256) and linked != manifest.sha256):
        # (a whole-file sha256, the swarm's, the origin does not state: nothing ties its bytes to it)
        log.warning("DIAG: model origin answers for another file, the layers held are kept %s",
                    kv(model=manifest.sha256[:16], url=manifest.origin_url, origin_sha256=(linked or "")[:16] or None))
        raise DownloadFailed(f"{manifest.origin_url} now holds another file than this model "
                             f"({manifest.sha256[:16]}): its layers can come from peers only")
    manifest.validator = validator
    await asyncio.get_running_loop().run_in_executor(io, store.save, manifest)
    log.info("DIAG: model origin answered, its version recorded for the layers taken from peers %s",
             kv(model=manifest.sha256[:16], url=manifest.origin_url))


async def _async_fetch_version(store: PartialStore, manifest: Manifest, parts: list[str], url: str,
                               session: aiohttp.ClientSession, io: concurrent.futures.Executor,
                               stats: FetchStats, progress: Progress | None) -> None:
    loop = asyncio.get_running_loop()
    names = [t.name for t in manifest.tensors.values() if t.part in parts and t.part not in manifest.complete]
    have = await loop.run_in_executor(io, store.fetch_state, manifest.validator)  # every tensor's: kept
    for part in {manifest.tensors[n].part for n in names}:  # bytes counted into a part file that is gone
        if not await loop.run_in_executor(io, store.part_path(part).exists):
            for t in manifest.part_tensors(part):
                have.pop(t.name, None)
    w = _Writer(store, manifest, names, have)
    total = sum(manifest.tensors[n].n_bytes for n in names)
    stats.wanted_bytes = max(stats.wanted_bytes, total - w.received())
    if total - w.received():  # as a download does: refused before the disk is filled, not when it is full
        free = (await loop.run_in_executor(io, shutil.disk_usage, store.dir)).free
        if total - w.received() > free:
            raise DownloadFailed(f"not enough disk space: {(total - w.received()) / 1e6:.0f} MB of layers to fetch, "
                                 f"{free / 1e6:.0f} MB free in {store.dir.parent}")
    failures = 0
    try:
        while spans := w.spans():
            stats.attempts += 1
            before = w.received()
            try:
                for a, b in _coalesce(spans, const.PARTIAL_COALESCE_GAP):
                    if await _async_range(session, url, manifest, w, a, b, io, stats, progress, total):
                        break  # the server sent the file through: every wanted byte went by
                failures = 0
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError, _Retry) as exc:
                if (at_once := cert_failure(exc, url) or rebound(exc)) is not None:  # another try fares no better
                    raise DownloadFailed(f"fetching layers from {manifest.origin_url} failed: {at_once}") from exc
                failures = 1 if w.received() > before else failures + 1  # progress: not a failure streak
                if failures >= const.DOWNLOAD_RETRIES:
                    raise DownloadFailed(f"fetching layers from {manifest.origin_url} failed {failures} times; "
                                         f"last: {describe_error(exc)} (what arrived is kept)") from exc
                asked = exc.retry_after_s if isinstance(exc, Retryable) else None
                delay = max(retry_delay(failures), asked or 0.0)
                log.info("DIAG: layer fetch interrupted, resuming %s", kv(
                    url=manifest.origin_url, attempt=failures, retry_in_s=round(delay, 2), retry_after_s=asked,
                    error=describe_error(exc)))
                await loop.run_in_executor(io, w.checkpoint)
                await asyncio.sleep(delay)
    finally:
        await loop.run_in_executor(io, w.close)
    await loop.run_in_executor(io, w.finish_parts)


async def _async_range(session: aiohttp.ClientSession, url: str, manifest: Manifest, w: _Writer, a: int, b: int,
                       io: concurrent.futures.Executor, stats: FetchStats, progress: Progress | None,
                       total: int) -> bool:
    """One request for origin bytes [a, b); True when the server sent the whole file instead."""
    loop = asyncio.get_running_loop()
    headers = {"Range": f"bytes={a}-{b - 1}", "Accept-Encoding": "identity",
               **await loop.run_in_executor(io, hub_headers, url)}
    if manifest.validator:
        headers["If-Range"] = manifest.validator
    async with session.get(url, headers=headers, auto_decompress=False) as resp:
        stats.requests += 1
        if resp.status in (429, 500, 502, 503, 504):
            raise _Retry(f"HTTP {resp.status}", retry_after_s(resp.headers))
        if resp.status not in (200, 206):
            hint = "" if resp.history else refusal_hint(url, resp.status, "Authorization" in headers)
            raise DownloadFailed(f"{http_error(resp.status)} from {manifest.origin_url}{hint}")
        if resp.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
            raise DownloadFailed(f"{manifest.origin_url} sent the file encoded, asked identity")
        if resp.status == 206:
            first, size = content_range(resp.headers.get("Content-Range"))
            if size is None:
                raise _Retry(f"a 206 without a usable Content-Range ({resp.headers.get('Content-Range')!r})")
            if size != manifest.size_bytes or resume_validator(resp.headers) != manifest.validator:
                # another version (a server that ignores If-Range still names it): never spliced
                raise _OriginChanged(f"size {size}, was {manifest.size_bytes}; validator "
                                     f"{resume_validator(resp.headers)!r}, was {manifest.validator!r}")
            if first != a:
                raise _Retry(f"server sent bytes from {first}, asked from {a}")
            pos, stop, through = a, b, False
        else:
            if resume_validator(resp.headers) != manifest.validator or resp.content_length != manifest.size_bytes:
                raise _OriginChanged("a full answer to If-Range: another version")
            if not w.read_through:
                w.read_through = True
                log.warning("DIAG: model origin ignores Range, reading the file through %s",
                            kv(url=manifest.origin_url))
            pos, stop, through = 0, max(e for _s, e in w.spans()), True
        since, last_emit = 0, 0.0
        while pos < stop:
            chunk = await resp.content.read(min(_CHUNK, stop - pos))
            if not chunk:
                break
            stats.wire_bytes += len(chunk)
            await loop.run_in_executor(io, w.write, pos, chunk)
            pos += len(chunk)
            since += len(chunk)
            if since >= const.PARTIAL_STATE_EVERY:
                since = 0
                await loop.run_in_executor(io, w.checkpoint)
            now = time.monotonic()
            if progress is not None and now - last_emit >= const.DOWNLOAD_PROGRESS_S:
                last_emit = now
                progress(w.received(), total)
        if pos < stop:
            raise aiohttp.ClientPayloadError(f"range ended at byte {pos} of {a}-{b - 1}")
    if progress is not None:
        progress(w.received(), total)
    return through
