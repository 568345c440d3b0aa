"""A partial model opened from a header the swarm gave, for when no origin can be read (a LAN
without internet, a holder that was given the file, an origin this node may not use).

`create_from_header(directory, header_data, header, sha256=, size_bytes=, origin_url=)` (blocking)
makes, or reuses, a partial model holding nothing: the header bytes are the ones a holder sent,
already checked against the advertised header hash (node/inference/headers.py), and checked again
here; its id is the swarm's (the holders' advertised whole-file sha256), so it chains with them.
Its layers then come from peers only (their hashes; kept `unchecked` until an origin, if one is
named, vouches), and the validator is unknown (`None`): an origin that answers later for a file of
the same header and size and the same whole-file sha256 (stated: one stating none is never used for a
whole-file id, its bytes being tied to it by nothing) has its validator
recorded (`async_adopt_origin`, before a fetch; when that probe gets no answer, by the fetch's
first answer: fetch.py `_async_first_version`) and the parts kept here stay unchecked until its
spot check; an origin holding another file fails the fetch, and nothing held is removed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import aiohttp

from node import const
from node.errors import DownloadFailed, ModelLoadError
from node.logs import kv
from node.models.download.fetch import Retryable
from node.models.download.urls import describe_error, display_url, resolve_url
from node.models.gguf_meta import GgufHeader

from .fetch import _timeout
from .layout import Manifest, PartialStore, new_manifest
from .probe import async_probe
from .session import origin_session

log = logging.getLogger("node.models.partial.fetch")


def create_from_header(directory: Path, header_data: bytes, header: GgufHeader, *, sha256: str, header_sha256: str,
                       size_bytes: int, origin_url: str | None) -> Path:
    """The partial model directory (resolved); ModelLoadError when the header is not the one named."""
    if hashlib.sha256(header_data).hexdigest() != header_sha256 or len(header_data) != header.data_offset:
        raise ModelLoadError(f"the header held for {sha256[:16]} is not the one its holders advertise")
    store = PartialStore(directory)
    if PartialStore.is_partial(directory):
        old = store.load()
        if (old.sha256, old.header_sha256, old.size_bytes) == (sha256, header_sha256, size_bytes):
            return directory.resolve()
    manifest = new_manifest(header, header_data, origin_url=origin_url or "", validator=None,
                            size_bytes=size_bytes, sha256=sha256)
    store.create(manifest, header_data, header)
    log.info("DIAG: partial model created from the swarm's header %s", kv(
        model=sha256[:16], origin=origin_url or "none", size_mb=round(size_bytes / 1e6, 1), n_layers=manifest.n_layers))
    return directory.resolve()


async def async_adopt_origin(store: PartialStore, manifest: Manifest, url: str) -> bool | None:
    """A manifest with no validator takes the origin's, if the origin answers now with the same
    header and size, and the same whole-file sha256 where it states one, which it must for a known
    sha256 (the swarm's) (True); False when it answered but nothing changes (another file, no sha256
    for a known one, no version named); None when it could not be read (unreachable, busy: 429/5xx, no
    answer within PARTIAL_HELD_PROBE_S): the caller asks it nothing more this fetch."""
    try:
        async with asyncio.timeout(const.PARTIAL_HELD_PROBE_S), \
                origin_session(_timeout()) as session:
            data, _header, size, validator, linked = await async_probe(url, session)
    except (aiohttp.ClientError, TimeoutError, DownloadFailed, ModelLoadError, Retryable) as exc:
        log.info("DIAG: model origin not reachable, layers taken from peers stay unchecked %s",
                 kv(model=manifest.sha256[:16], error=getattr(exc, "message", None) or describe_error(exc)))
        return None
    same = hashlib.sha256(data).hexdigest() == manifest.header_sha256 and size == manifest.size_bytes
    if manifest.whole_sha256 and linked is None:
        # the swarm's sha256: header and size do not tie an origin's bytes to it (a file replaced in
        # place at a plain server, a GitHub release, S3): not used, layers from peers only
        log.warning("DIAG: model origin states no sha256, not used for the swarm's model (peers only) %s",
                    kv(model=manifest.sha256[:16], url=display_url(resolve_url(url))))
        return False
    if validator is None:  # (an origin that names no version: nothing to record)
        return False
    if not same or (linked is not None and linked != manifest.sha256):  # (replaced in place: same header and size)
        log.warning("DIAG: model origin answers for another file, layers taken from peers stay unchecked %s",
                    kv(model=manifest.sha256[:16], url=display_url(resolve_url(url)),
                       origin_sha256=(linked or "")[:16] or None))
        return False
    manifest.validator = validator
    await asyncio.get_running_loop().run_in_executor(None, store.save, manifest)
    log.info("DIAG: model origin answered, its version recorded for the layers taken from peers %s",
             kv(model=manifest.sha256[:16], url=display_url(resolve_url(url))))
    return True
