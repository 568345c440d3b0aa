"""Layers of a partial model fetched from a peer that holds them, trusted only as far as the origin
vouches for them.

`async_fetch_parts_from(store, manifest, parts, source, origin_url=…)`:

1. The peer (a `PartSource`: the MODEL_PART frames of node/inference/pipeline/partials.py) names
   the sha256 of every tensor of the wanted parts it holds complete. Those hashes are what its
   node computed over bytes it fetched from the origin (or from a peer it checked the same way).
2. The tensors come in PARTIAL_PEER_CHUNK chunks, PARTIAL_PEER_WINDOW requests in flight, written
   through the same writer as origin bytes (resumable per tensor, `fetch.json`).
3. Each complete part is hashed here: a part whose bytes do not hash to what the peer named (its
   disk is corrupt, or it altered the bytes but not the names) is quarantined, logged, and left to
   the origin.
4. A peer's names alone prove nothing (it could alter bytes and names together), so the parts
   are complete but `unchecked` (never served on, and still unchecked after a crash) until the
   origin vouches: per part, one range of PARTIAL_SPOT_CHECK_BYTES of a tensor chosen uniformly
   (a small tensor is compared whole) is fetched from the origin (`Range`, `If-Range` the
   manifest's validator) and compared. A mismatch quarantines every part taken from that peer in
   this fetch and marks the result `lied`: the caller stops asking it and fetches those parts from
   the origin. With the origin unreachable the parts stay unchecked (shown in diagnostics) and are
   checked on the next fetch that reaches the origin (`async_spot_check_held`).
   A part the peer did not finish (it went, it erred) keeps none of its bytes as a resume point:
   only whole parts are checked against its names.

Peer agreement never makes bytes trusted: two peers naming the same hashes is not checked here as
evidence of anything; only the origin settles a disagreement (seed 000).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from node import const
from node.errors import DownloadFailed, NodeError, PeerError
from node.logs import kv
from node.models.download.fetch import content_range, resume_validator
from node.models.download.hub import hub_headers
from node.models.download.urls import describe_error, resolve_url
from node.models.header import read_range
from node.values import is_sha256

from .fetch import Progress, _timeout, _Writer
from .layout import Manifest, PartialStore, TensorRecord
from .session import origin_session

log = logging.getLogger(__name__)



class PartSource(Protocol):
    """A peer holding tensors of a partial model (or anything answering like one)."""

    label: str  # for logs: the peer's short id

    async def async_hashes(self, model: str, parts: list[str]) -> dict[str, str]:
        """tensor name -> sha256, for the tensors of those parts the peer holds complete."""

    async def async_read(self, model: str, tensor: str, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) of a tensor (n ≤ PARTIAL_PEER_CHUNK)."""


@dataclass
class PeerFetchStats:
    peer_bytes: int = 0  # tensor bytes received from the peer
    parts: list[str] = field(default_factory=list)  # taken from it and kept
    rejected: list[str] = field(default_factory=list)  # did not hash to what it named: quarantined
    spot_checked: bool = False  # one range compared with the origin's bytes
    origin_bytes: int = 0  # what the spot check read from the origin
    lied: bool = False  # its bytes matched its names but not the origin: everything taken dropped


class SpotCheckFailed(Exception):
    """The origin could not be asked (unreachable, another version): nothing was compared."""


async def async_fetch_parts_from(store: PartialStore, manifest: Manifest, parts: list[str], source: PartSource, *,
                                 origin_url: str | None, rng: random.Random | None = None,
                                 session: aiohttp.ClientSession | None = None,
                                 progress: Progress | None = None) -> PeerFetchStats:
    """Fetch the missing parts among `parts` that `source` holds (see the module doc). NodeError
    from the peer (it went, it holds nothing of these) ends the fetch with what was kept; the
    caller gets the rest from the origin."""
    loop = asyncio.get_running_loop()
    stats = PeerFetchStats()
    wanted = [p for p in parts if p not in manifest.complete]
    if not wanted:
        return stats
    named = await source.async_hashes(manifest.sha256, wanted)
    expected = {n: h for n, h in named.items() if is_sha256(h) and n in manifest.tensors}
    offered = [p for p in wanted if all(t.name in expected for t in manifest.part_tensors(p))]
    if not offered:
        return stats
    io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="partial-peer")
    try:
        names = [t.name for p in offered for t in manifest.part_tensors(p)]
        have = await loop.run_in_executor(io, store.fetch_state, manifest.validator)
        for part in offered:
            if not await loop.run_in_executor(io, store.part_path(part).exists):
                for t in manifest.part_tensors(part):
                    have.pop(t.name, None)
        before = dict(have)  # what was here: the origin's (or nothing)
        w = _Writer(store, manifest, names, have)
        total = sum(t.n_bytes for t in w.tensors)
        last = [0.0]

        def moved() -> None:
            now = time.monotonic()
            if progress is not None and (now - last[0] >= const.DOWNLOAD_PROGRESS_S or w.received() >= total):
                last[0] = now
                progress(w.received(), total)
        try:
            for t in w.tensors:
                stats.peer_bytes += await _async_tensor(source, manifest, t, w, io, moved)
        except NodeError as exc:
            log.warning("DIAG: layer fetch from peer stopped, the rest comes from the origin %s",
                        kv(peer_id=source.label, model=manifest.sha256[:16], error=exc.message))
        finally:
            # A part the peer did not finish is not checked against its names (finish_parts only
            # sees whole parts), so its bytes must not stand as a resume point for the origin's
            # fetch: those tensors' counts go back to what was here before the peer.
            for part in offered:
                ts = manifest.part_tensors(part)
                if any(w.have.get(t.name, 0) < t.n_bytes for t in ts):
                    for t in ts:
                        if t.name in before:
                            w.have[t.name] = before[t.name]
                        else:
                            w.have.pop(t.name, None)
            await loop.run_in_executor(io, w.close)
        # complete and unchecked in one step (and one manifest write): until the origin vouches for
        # them, they are neither served to others nor trusted after a crash
        stats.parts, stats.rejected = await loop.run_in_executor(io, w.finish_parts, expected)
        for part in stats.rejected:
            log.warning("DIAG: partial model part from a peer did not hash to what it named, quarantined "
                        "and fetched from the origin %s", kv(peer_id=source.label, model=manifest.sha256[:16],
                                                             part=part))
        if stats.parts:
            await _async_check_or_drop(store, manifest, stats.parts, source.label, origin_url, stats, rng, session, io)
    except OSError as exc:  # disk full, a file gone: the caller goes on with the origin
        raise DownloadFailed(f"writing layers from peer {source.label} failed: {type(exc).__name__}: "
                             f"{exc.strerror or exc}") from exc
    finally:
        io.shutdown(wait=False)
    log.info("DIAG: partial model parts fetched from a peer %s", kv(
        peer_id=source.label, model=manifest.sha256[:16], parts=len(stats.parts), rejected=len(stats.rejected),
        peer_mb=round(stats.peer_bytes / 1e6, 1), spot_checked=stats.spot_checked, lied=stats.lied,
        held=manifest.describe()))
    return stats


async def _async_tensor(source: PartSource, manifest: Manifest, t: TensorRecord, w: _Writer,
                        io: concurrent.futures.Executor, moved: Callable[[], None]) -> int:
    """One tensor's missing bytes, chunk by chunk, a window of requests ahead; returns the bytes."""
    loop = asyncio.get_running_loop()
    start = w.have.get(t.name, 0)
    offsets = list(range(start, t.n_bytes, const.PARTIAL_PEER_CHUNK))
    pending: list[asyncio.Task[bytes]] = []
    got = 0
    try:
        for i, off in enumerate(offsets):
            while len(pending) < const.PARTIAL_PEER_WINDOW and i + len(pending) < len(offsets):
                o = offsets[i + len(pending)]
                pending.append(asyncio.ensure_future(source.async_read(
                    manifest.sha256, t.name, o, min(const.PARTIAL_PEER_CHUNK, t.n_bytes - o))))
            data = await pending.pop(0)
            n = min(const.PARTIAL_PEER_CHUNK, t.n_bytes - off)
            if len(data) != n:
                raise PeerError(f"{t.name} bytes {off}+{n}: the peer sent {len(data)}", code="protocol_error")
            await loop.run_in_executor(io, w.write, t.offset + off, data)
            got += n
            moved()
    finally:
        for task in pending:
            task.cancel()
        if pending:  # retrieved: a chunk that failed meanwhile is not "never retrieved"
            await asyncio.gather(*pending, return_exceptions=True)
    return got


async def _async_check_or_drop(store: PartialStore, manifest: Manifest, taken: list[str], label: str,
                               origin_url: str | None, stats: PeerFetchStats, rng: random.Random | None,
                               session: aiohttp.ClientSession | None, io: concurrent.futures.Executor) -> None:
    """The parts just taken (complete, unchecked) against the origin: checked, dropped, or left unchecked."""
    loop = asyncio.get_running_loop()
    try:
        bad, n = await async_spot_check(store, manifest, taken, origin_url, rng=rng, session=session)
    except SpotCheckFailed as exc:
        log.warning("DIAG: partial model parts from a peer not checked against the origin (kept, checked "
                    "on the next fetch that reaches it) %s", kv(peer_id=label, model=manifest.sha256[:16],
                                                               parts=len(taken), reason=str(exc)))
        return
    stats.spot_checked, stats.origin_bytes = True, n
    if not bad:
        manifest.mark_checked(taken)
        await loop.run_in_executor(io, store.save, manifest)
        return
    stats.lied = True  # its bytes hashed to its names, and the origin says otherwise: nothing of it stays
    for part in taken:
        await loop.run_in_executor(io, store.quarantine, manifest, part)
    await loop.run_in_executor(io, store.save, manifest)
    log.warning("DIAG: partial model parts from a peer do not match the origin, quarantined, fetching them "
                "from the origin %s", kv(peer_id=label, model=manifest.sha256[:16], parts=len(taken),
                                         mismatched=",".join(bad)))
    stats.rejected += taken
    stats.parts = []


async def async_spot_check(store: PartialStore, manifest: Manifest, parts: list[str], origin_url: str | None, *,
                           rng: random.Random | None = None,
                           session: aiohttp.ClientSession | None = None) -> tuple[list[str], int]:
    """One range per part compared with the origin's bytes: (the parts whose range differs, bytes
    read from the origin). Per part, a tensor chosen uniformly (so a small one — a norm — is as
    likely as a large one, and a tensor of at most PARTIAL_SPOT_CHECK_BYTES is compared whole),
    then a range of it chosen uniformly. SpotCheckFailed when the origin could not be asked or
    answered for another version (nothing is concluded)."""
    if not origin_url:
        raise SpotCheckFailed("no origin URL")
    rng = rng or random.SystemRandom()
    url = resolve_url(origin_url)
    own = session is None
    session = session or origin_session(_timeout())
    bad, read = [], 0
    try:
        for part in parts:
            tensors = [t for t in manifest.part_tensors(part) if t.n_bytes]
            if not tensors:
                continue
            t = tensors[rng.randrange(len(tensors))]
            n = min(const.PARTIAL_SPOT_CHECK_BYTES, t.n_bytes)
            at = rng.randrange(t.n_bytes - n + 1)
            theirs = await _async_origin_range(session, url, manifest, t.offset + at, n)
            read += len(theirs)
            try:
                ours = await asyncio.get_running_loop().run_in_executor(
                    None, read_range, store.part_path(t.part), t.local + at, n)
            except OSError as exc:
                raise DownloadFailed(f"reading {part} for its check failed: {exc.strerror or exc}") from exc
            ok = ours == theirs
            log.info("DIAG: spot check against the origin %s", kv(model=manifest.sha256[:16], part=part,
                                                                 tensor=t.name, offset=at, bytes=n, match=ok))
            if not ok:
                bad.append(part)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SpotCheckFailed(describe_error(exc)) from exc
    finally:
        if own:
            await session.close()
    return bad, read


async def _async_origin_range(session: aiohttp.ClientSession, url: str, manifest: Manifest, start: int,
                              n: int) -> bytes:
    headers = {"Range": f"bytes={start}-{start + n - 1}", "Accept-Encoding": "identity",
               **await asyncio.get_running_loop().run_in_executor(None, hub_headers, url)}
    if manifest.validator:
        headers["If-Range"] = manifest.validator
    async with session.get(url, headers=headers, auto_decompress=False) as resp:
        if resp.status != 206:
            raise SpotCheckFailed(f"HTTP {resp.status} for a range (another version, or no ranges)")
        first, size = content_range(resp.headers.get("Content-Range"))
        if first != start or size != manifest.size_bytes or resume_validator(resp.headers) != manifest.validator:
            raise SpotCheckFailed("the origin answered for another range or version")
        buf = bytearray()
        while len(buf) < n:
            chunk = await resp.content.read(n - len(buf))
            if not chunk:
                break
            buf += chunk
    if len(buf) != n:
        raise SpotCheckFailed(f"the origin sent {len(buf)} bytes, asked {n}")
    return bytes(buf)


async def async_spot_check_held(store: PartialStore, manifest: Manifest, origin_url: str | None, *,
                                rng: random.Random | None = None) -> list[str]:
    """Check the parts kept unchecked (a peer's, taken while the origin was unreachable) now; a
    mismatch quarantines them all. Returns the parts quarantined; SpotCheckFailed keeps waiting."""
    parts = sorted(p for p in manifest.unchecked if p in manifest.complete)
    loop = asyncio.get_running_loop()
    bad, _n = await async_spot_check(store, manifest, parts, origin_url, rng=rng) if parts else ([], 0)
    if bad:
        for part in parts:
            await loop.run_in_executor(None, store.quarantine, manifest, part)
        log.warning("DIAG: partial model parts taken from a peer unchecked do not match the origin, "
                    "quarantined %s", kv(model=manifest.sha256[:16], parts=len(parts), mismatched=",".join(bad)))
    manifest.mark_checked(parts)
    await loop.run_in_executor(None, store.save, manifest)
    return parts if bad else []
