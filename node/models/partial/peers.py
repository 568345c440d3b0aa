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
4. A peer's names alone prove nothing (it could alter bytes and names together), so one random
   range of PARTIAL_SPOT_CHECK_BYTES of the bytes taken from it is fetched from the origin
   (`Range`, `If-Range` the manifest's validator) and compared. A mismatch quarantines every part
   taken from that peer in this fetch and marks the result `lied`: the caller stops asking it and
   fetches those parts from the origin. With the origin unreachable the parts are kept but
   recorded as not checked (`manifest.unchecked`, shown in diagnostics), and checked on the next
   fetch that reaches the origin (`async_spot_check_held`).

Peer agreement never makes bytes trusted: two peers naming the same hashes is not checked here as
evidence of anything; only the origin settles a disagreement (seed 000).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from node import const
from node.errors import NodeError, PeerError
from node.logs import kv
from node.models.download.fetch import content_range, resume_validator
from node.models.download.urls import describe_error, resolve_url

from .fetch import Progress, _timeout, _Writer
from .layout import Manifest, PartialStore, TensorRecord

log = logging.getLogger(__name__)

_SHA = re.compile(r"[0-9a-f]{64}")


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
    expected = {n: h for n, h in named.items() if isinstance(h, str) and _SHA.fullmatch(h) and n in manifest.tensors}
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
            await loop.run_in_executor(io, w.close)
        stats.parts, stats.rejected = await loop.run_in_executor(io, w.finish_parts, expected)
        for part in stats.rejected:
            log.warning("DIAG: partial model part from a peer did not hash to what it named, quarantined "
                        "and fetched from the origin %s", kv(peer_id=source.label, model=manifest.sha256[:16],
                                                             part=part))
        if stats.parts:
            await _async_check_or_drop(store, manifest, stats.parts, source.label, origin_url, stats, rng, session, io)
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
    return got


async def _async_check_or_drop(store: PartialStore, manifest: Manifest, taken: list[str], label: str,
                               origin_url: str | None, stats: PeerFetchStats, rng: random.Random | None,
                               session: aiohttp.ClientSession | None, io: concurrent.futures.Executor) -> None:
    loop = asyncio.get_running_loop()
    try:
        ok, n = await async_spot_check(store, manifest, taken, origin_url, rng=rng, session=session)
    except SpotCheckFailed as exc:
        manifest.mark_unchecked(taken)
        await loop.run_in_executor(io, store.save, manifest)
        log.warning("DIAG: partial model parts from a peer not checked against the origin (kept, checked "
                    "on the next fetch that reaches it) %s", kv(peer_id=label, model=manifest.sha256[:16],
                                                               parts=len(taken), reason=str(exc)))
        return
    stats.spot_checked, stats.origin_bytes = True, n
    if ok:
        return
    stats.lied = True
    for part in taken:
        await loop.run_in_executor(io, store.quarantine, manifest, part)
    await loop.run_in_executor(io, store.save, manifest)
    log.warning("DIAG: partial model parts from a peer do not match the origin, quarantined, fetching them "
                "from the origin %s", kv(peer_id=label, model=manifest.sha256[:16], parts=len(taken)))
    stats.rejected += taken
    stats.parts = []


async def async_spot_check(store: PartialStore, manifest: Manifest, parts: list[str], origin_url: str | None, *,
                           rng: random.Random | None = None,
                           session: aiohttp.ClientSession | None = None) -> tuple[bool, int]:
    """(whether one random range of the parts' bytes equals the origin's, bytes read from the
    origin). SpotCheckFailed when the origin could not be asked or answered for another version."""
    if not origin_url:
        raise SpotCheckFailed("no origin URL")
    rng = rng or random.SystemRandom()
    tensors = [t for p in parts for t in manifest.part_tensors(p) if t.n_bytes]
    if not tensors:
        return True, 0
    # a byte chosen uniformly over all of them, and the range around it
    pick = rng.randrange(sum(t.n_bytes for t in tensors))
    for t in tensors:
        if pick < t.n_bytes:
            break
        pick -= t.n_bytes
    n = min(const.PARTIAL_SPOT_CHECK_BYTES, t.n_bytes)
    at = max(0, min(pick - n // 2, t.n_bytes - n))
    url = resolve_url(origin_url)
    headers = {"Range": f"bytes={t.offset + at}-{t.offset + at + n - 1}", "Accept-Encoding": "identity"}
    if manifest.validator:
        headers["If-Range"] = manifest.validator
    own = session is None
    session = session or aiohttp.ClientSession(timeout=_timeout())
    try:
        async with session.get(url, headers=headers, auto_decompress=False) as resp:
            if resp.status != 206:
                raise SpotCheckFailed(f"HTTP {resp.status} for a range (another version, or no ranges)")
            first, size = content_range(resp.headers.get("Content-Range"))
            if first != t.offset + at or size != manifest.size_bytes \
                    or resume_validator(resp.headers) != manifest.validator:
                raise SpotCheckFailed("the origin answered for another range or version")
            buf = bytearray()
            while len(buf) < n:
                chunk = await resp.content.read(n - len(buf))
                if not chunk:
                    break
                buf += chunk
            theirs = bytes(buf)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SpotCheckFailed(describe_error(exc)) from exc
    finally:
        if own:
            await session.close()
    if len(theirs) != n:
        raise SpotCheckFailed(f"the origin sent {len(theirs)} bytes, asked {n}")
    ours = await asyncio.get_running_loop().run_in_executor(None, _read, store, t, at, n)
    ok = ours == theirs
    log.info("DIAG: spot check against the origin %s", kv(model=manifest.sha256[:16], tensor=t.name, offset=at,
                                                         bytes=n, match=ok))
    return ok, len(theirs)


def _read(store: PartialStore, t: TensorRecord, at: int, n: int) -> bytes:
    with open(store.part_path(t.part), "rb") as fh:
        fh.seek(t.local + at)
        return fh.read(n)


async def async_spot_check_held(store: PartialStore, manifest: Manifest, origin_url: str | None, *,
                                rng: random.Random | None = None) -> list[str]:
    """Check the parts kept unchecked (a peer's, taken while the origin was unreachable) now; a
    mismatch quarantines them all. Returns the parts quarantined; SpotCheckFailed keeps waiting."""
    parts = sorted(p for p in manifest.unchecked if p in manifest.complete)
    if not parts:
        manifest.mark_unchecked(None)
        return []
    ok, _n = await async_spot_check(store, manifest, parts, origin_url, rng=rng)
    loop = asyncio.get_running_loop()
    manifest.mark_unchecked(None)
    if not ok:
        for part in parts:
            await loop.run_in_executor(None, store.quarantine, manifest, part)
        log.warning("DIAG: partial model parts taken from a peer unchecked do not match the origin, "
                    "quarantined %s", kv(model=manifest.sha256[:16], parts=len(parts)))
    await loop.run_in_executor(None, store.save, manifest)
    return [] if ok else parts
