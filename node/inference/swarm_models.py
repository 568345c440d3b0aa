"""Models this node holds nothing of but the swarm serves: learnt from peers' adverts, registered
for their tokenizer once their header is here.

When a connected peer advertises a model (by sha256) that is not in this node's catalog, its
header is obtained in the background (the cache in `<data_dir>/headers/` first, else the origin,
else a holder: headers.py), at most `MODEL_HEADER_FETCHES` at once, so the first request does not
pay for it; a request that names such a model while its header is on the way waits for it. The
model is then a catalog entry with source "swarm" (id = advertised name + the advertised FULL
file's sha256[:8], the id every node uses) and a `ServedModel(whole=False)`: the pipeline runs it
across the holders like any model held in slices.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from node import const
from node.errors import NodeError
from node.inference.headers import HeaderAdvert, HeaderFetcher, parse_advert
from node.inference.manager import ModelManager
from node.logs import kv
from node.models.catalog import ModelCatalog, ModelEntry
from node.models.header import HeaderCache

log = logging.getLogger(__name__)


class SwarmModels:
    """Registers the models peers serve that this node has no file of."""

    def __init__(self, catalog: ModelCatalog, models: ModelManager, peers: Any, cache: HeaderCache,
                 fetcher: HeaderFetcher | None = None):
        self.catalog = catalog
        self.models = models
        self.peers = peers  # PeerManager: peers() snapshots, subscribe()
        self.cache = cache
        self.fetcher = fetcher or HeaderFetcher(peers)
        self.fetches = 0  # headers fetched from a peer or an origin (not from the cache) in this run
        self._tasks: dict[str, asyncio.Task[bool]] = {}  # by model sha256
        self._names: dict[str, HeaderAdvert] = {}  # sha256 -> the advert its task was started for
        self._failed_at: dict[str, float] = {}
        self._limit = asyncio.Semaphore(const.MODEL_HEADER_FETCHES)
        self._unsubscribe = None

    def start(self) -> None:
        """Watch the peer table (and look at what is already there)."""
        self._unsubscribe = self.peers.subscribe(lambda _kind, _snap: self._scan())
        self._scan()

    def close(self) -> None:
        """Stop watching; cancel fetches still running."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for task in self._tasks.values():
            task.cancel()

    def adverts(self, sha256: str | None = None) -> dict[str, list[HeaderAdvert]]:
        """Connected peers' adverts of models with a header to fetch, by model sha256."""
        out: dict[str, list[HeaderAdvert]] = {}
        for snap in self.peers.peers():
            if snap.state != "connected":
                continue
            for m in snap.models:
                advert = parse_advert(snap.node_id, m)
                if advert is not None and (sha256 is None or advert.sha256 == sha256):
                    out.setdefault(advert.sha256, []).append(advert)
        return out

    def _scan(self) -> None:
        """Start a header task for every advertised model not in the catalog (on the loop)."""
        now = time.monotonic()
        for sha, adverts in self.adverts().items():
            if self.catalog.by_sha(sha) is not None:
                continue
            task = self._tasks.get(sha)
            if task is not None and not task.done():
                continue
            if now - self._failed_at.get(sha, -1e9) < const.MODEL_HEADER_RETRY_S:
                continue
            self._names[sha] = adverts[0]
            self._tasks[sha] = asyncio.get_running_loop().create_task(
                self._async_obtain(sha), name=f"model-header-{sha[:8]}")

    async def async_wait_for(self, name: str) -> bool:
        """A request names a model by id, readable name or sha256 prefix: if its header is on the
        way, wait for it. True when the model is registered now."""
        lowered = name.lower()
        for sha, advert in list(self._names.items()):
            hit = name in (advert.model_id, advert.name) or \
                (len(lowered) >= 8 and re.fullmatch(r"[0-9a-f]+", lowered) and sha.startswith(lowered))
            task = self._tasks.get(sha)
            if hit and task is not None:
                return await asyncio.shield(task)
        return False

    async def _async_obtain(self, sha: str) -> bool:
        async with self._limit:
            if self.catalog.by_sha(sha) is not None:
                return True
            adverts = self.adverts(sha).get(sha, [])
            if not adverts:
                return False  # its holders left while we waited our turn
            started = time.monotonic()
            loop = asyncio.get_running_loop()
            try:
                got, source = None, "cache"
                for header_sha in dict.fromkeys(a.header_sha256 for a in adverts):
                    first = next(a for a in adverts if a.header_sha256 == header_sha)
                    got = await loop.run_in_executor(None, lambda a=first: self.cache.load(
                        sha, header_sha256=a.header_sha256, n_layers=a.n_layers, architecture=a.architecture,
                        max_bytes=self.fetcher.max_bytes))
                    if got is not None:
                        advert = first
                        break
                if got is None:
                    data, header, source, advert = await self.fetcher.async_fetch(adverts)
                    self.fetches += 1
                    vocab = await loop.run_in_executor(None, self.cache.store, sha, data, header)
                else:
                    vocab, header = got
            except NodeError as exc:
                self._failed_at[sha] = time.monotonic()
                log.warning("DIAG: model from the swarm unavailable %s", kv(model=sha[:16], error=exc.message))
                return False
            entry = ModelEntry(advert.model_id, advert.name, vocab, sha, advert.size_bytes, "swarm", header,
                               header_sha256=advert.header_sha256, header_bytes=advert.header_bytes,
                               origin_url=advert.origin_url)
            # registered before the catalog has it: a request cannot resolve it half-made (no tokenizer)
            served = await self.models.async_register(entry, whole=False)
            if served.tokenizer is None:
                self._failed_at[sha] = time.monotonic()
                return False  # the manager logged why llama.cpp could not read it
            if self.catalog.add_swarm_entry(entry) is not entry:
                return True  # a file of it turned up meanwhile (its own registration replaces ours)
            log.info("DIAG: registered model from the swarm %s", kv(
                model=entry.id, source=source, header_bytes=advert.header_bytes,
                elapsed_ms=round((time.monotonic() - started) * 1000, 1)))
            return True
