"""Whether a finished download's origin is public (download/public.py), checked in the background:
at the download's end, and once more at the node's start for the files whose check could not be
made then (a timeout, DNS, a refused connection: recorded `unchecked`, not shared; 2026-12-07: it was
recorded not public for good, so a download finished during a network blip was never shared while
unloaded; at that later start a certificate failure too, which may be that start's network's: a
captive portal, an inspecting proxy, a wrong clock; 2026-12-07, review r28). Only a public one's file is listed in the HELLO's `files` (wholeparts.held_files). The
checks are tasks of their own, cancelled and awaited at stop (moved out of node.py, 2026-12-07).
Whether the download sent the user's Hugging Face token is found once, at its end (this process
sent it), and kept with an `unchecked` record, whatever HF_TOKEN or HF_ENDPOINT the later start has
(2026-12-07: it looked at that start's environment, and a private repo's file checked again without
HF_TOKEN was recorded public); every check asks without a token whether one went or not, which only
names a failure (2026-12-07, review r31: a download without a token was public unasked). The
record is models/origin_record.py's OriginRecord (one type for the hash cache and these checks)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from node.config import NodeConfig
from node.logs import kv
from node.models.catalog import ModelCatalog
from node.models.download.hub import hub_headers
from node.models.download.public import async_origin_public

log = logging.getLogger(__name__)


def _size_or_none(path: Path) -> int | None:
    """The downloaded file's size (blocking); None when it is gone."""
    try:
        return path.stat().st_size
    except OSError:
        return None


class OriginChecks:
    """The origin checks under way; `announce()` sends a fresh HELLO (a file found public)."""

    def __init__(self, config: NodeConfig, catalog: ModelCatalog, announce: Callable[[], Awaitable[None]]):
        self.config, self.catalog, self.announce = config, catalog, announce
        self._tasks: set[asyncio.Task] = set()

    def start(self, path: Path, sha256: str, url: str) -> None:
        """Check a finished download's origin (`url`: the finishing job's own, query included)."""
        self._spawn(self._async_check_download(path, sha256, url), "download-origin-check")

    def recheck_unchecked(self) -> None:
        """At start: check again, once, the downloads whose check could not be made, and those found
        public under an older rule than hash_cache.PUBLIC_RULE (not shared meanwhile; in the
        background, each bounded by DOWNLOAD_PUBLIC_CHECK_S; still unchecked: again at the next start).
        Their URL is the recorded origin: an unchecked one had no query string nor `user:pass@`
        (those are decided without the network)."""
        self._spawn(self._async_recheck(), "download-origin-recheck")

    async def async_stop(self) -> None:
        """Cancel the checks and wait for them (none writes after the data dir's lock is released)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _async_recheck(self) -> None:
        loop = asyncio.get_running_loop()
        unchecked = await loop.run_in_executor(None, self.catalog.unchecked_origins)
        if unchecked:
            log.info("DIAG: model origins not checked before, checking them again %s", kv(files=len(unchecked)))
        await asyncio.gather(*(self._async_check(path, sha, record.url, record.token_sent, recheck=True)
                               for path, sha, record in unchecked if record.url is not None))

    async def _async_check_download(self, path: Path, sha256: str, url: str) -> None:
        # whether the download sent a token: the one this process sends there (hub.py, read just now)
        sent_token = bool(await asyncio.get_running_loop().run_in_executor(None, hub_headers, url))
        await self._async_check(path, sha256, url, sent_token)

    async def _async_check(self, path: Path, sha256: str, url: str, sent_token: bool, recheck: bool = False) -> None:
        """`recheck`: at a later start, maybe on another network (a certificate failure stays unchecked)."""
        size = await asyncio.get_running_loop().run_in_executor(None, _size_or_none, path)  # (what came back must be as big)
        public = await async_origin_public(url, sent_token=sent_token, size=size, lan_ok=self.config.public_lan_origins,
                                           recheck=recheck)
        write = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.catalog.set_origin_public, path, sha256, public, sent_token=sent_token))
        try:
            entry = await asyncio.shield(write)
        except asyncio.CancelledError:  # the stop awaits the write: none after the data dir's lock is released
            await asyncio.wait([write])
            raise
        if entry is not None and entry.origin_public:
            await self.announce()  # its HELLO `files` now lists it
