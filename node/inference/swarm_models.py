"""Models this node holds nothing of but the swarm serves: learnt from peers' adverts, registered
for their tokenizer once their header is here.

When a connected peer advertises a model (by sha256) that is not in this node's catalog, its
header is obtained in the background (the cache in `<data_dir>/headers/` first, else the origin,
else a holder: headers.py), at most `MODEL_HEADER_FETCHES` at once, so the first request does not
pay for it; a request that names such a model while its header is on the way waits for it. The
model is then a catalog entry with source "swarm" (id = advertised name + the advertised FULL
file's sha256[:8], the id every node uses) and a `ServedModel(whole=False)`: the pipeline runs it
across the holders like any model held in slices.

Bounded, since any member can advertise any number of made-up models: a model is fetched only
once a connected peer advertises it as servable (a layer range, or whole and not paused); at most
`MODEL_SWARM_MAX` swarm-only models (registered or on their way) and `MODEL_HEADER_QUEUE` fetches
(running or waiting) at a time, the rest skipped (logged once) until a later scan; the headers
cache keeps `MODEL_HEADER_CACHE_MAX` files, none unused for `MODEL_HEADER_CACHE_MAX_AGE_S`. A
swarm model never replaces one this node has: its id is checked against the catalog and the
manager before it is fetched and again before it is registered, and it goes into the manager only
once the catalog took this very entry.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from node import const
from node.errors import Conflict, ModelUnavailable, NodeError
from node.inference.headers import HeaderAdvert, HeaderFetcher, on_this_machine, parse_advert
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
        self._closed = False
        self._capped = False  # the last scan skipped a model at the cap (logged once per episode)
        self._prune_task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        """Watch the peer table (and look at what is already there); prune the headers cache."""
        self._unsubscribe = self.peers.subscribe(lambda _kind, _snap: self._scan())
        self._prune()
        self._scan()

    def close(self) -> None:
        """Stop watching; cancel fetches still running."""
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for task in list(self._tasks.values()):
            task.cancel()
        if self._prune_task is not None:
            self._prune_task.cancel()

    def _swarm_shas(self) -> frozenset[str]:
        return frozenset(e.sha256 for e in self.catalog.entries.values() if not e.has_file)

    def _pending(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    def _prune(self) -> None:
        """Bound the headers cache (off the loop; one prune at a time, the models registered kept)."""
        if self._prune_task is not None and not self._prune_task.done():
            return
        keep = self._swarm_shas() | frozenset(self._tasks)
        self._prune_task = asyncio.get_running_loop().create_task(asyncio.to_thread(
            self.cache.prune, max_files=const.MODEL_HEADER_CACHE_MAX,
            max_age_s=const.MODEL_HEADER_CACHE_MAX_AGE_S, keep=keep), name="model-headers-prune")

    def _clashes(self, advert: HeaderAdvert) -> bool:
        """A model of this id is here already (a file of ours, or another swarm model): an advert
        whose name and sha256[:8] copy a local model's would otherwise stand in for it."""
        return advert.model_id in self.catalog.entries or self.models.is_registered(advert.model_id)

    def _done(self, sha: str, task: asyncio.Task[bool]) -> None:
        if self._tasks.get(sha) is task:
            del self._tasks[sha]
            self._names.pop(sha, None)
        if not self._closed:
            self._scan()  # a place in the queue is free: models skipped meanwhile get their turn

    def adverts(self, sha256: str | None = None) -> dict[str, list[HeaderAdvert]]:
        """Connected peers' adverts of models with a header to fetch, by model sha256."""
        out: dict[str, list[HeaderAdvert]] = {}
        for snap in self.peers.peers():
            if snap.state != "connected":
                continue
            local = on_this_machine(snap.transport, snap.address)  # (its loopback origins are ours)
            for m in snap.models:
                advert = parse_advert(snap.node_id, m, local_peer=local)
                if advert is not None and (sha256 is None or advert.sha256 == sha256):
                    out.setdefault(advert.sha256, []).append(advert)
        return out

    def origin_of(self, entry: ModelEntry) -> str | None:
        """An origin a connected holder names now for this model's file (the same header), if any."""
        return next((a.origin_url for a in self.adverts(entry.sha256).get(entry.sha256, [])
                     if a.origin_url and a.header_sha256 == entry.header_sha256), None)

    def _scan(self) -> None:
        """Start a header task for every advertised model not in the catalog (on the loop)."""
        now = time.monotonic()
        for sha, at in list(self._failed_at.items()):  # bounded: only failures still waiting out their retry
            if now - at >= const.MODEL_HEADER_RETRY_S:
                del self._failed_at[sha]
        capped = False
        for sha, adverts in self.adverts().items():
            if self.catalog.by_sha(sha) is not None or sha in self._tasks or sha in self._failed_at:
                continue
            servable = [a for a in adverts if a.servable]
            if not servable or self._clashes(servable[0]):
                continue  # nobody serves it yet, or its id is a model here already
            if len(self._swarm_shas()) + self._pending() >= const.MODEL_SWARM_MAX or \
                    self._pending() >= const.MODEL_HEADER_QUEUE:
                capped = True
                continue
            self._names[sha] = servable[0]
            task = asyncio.get_running_loop().create_task(self._async_obtain(sha), name=f"model-header-{sha[:8]}")
            self._tasks[sha] = task
            task.add_done_callback(lambda t, sha=sha: self._done(sha, t))
        if capped and not self._capped:
            log.warning("DIAG: models from the swarm skipped at the cap %s", kv(
                registered=len(self._swarm_shas()), fetching=self._pending(), max_models=const.MODEL_SWARM_MAX,
                max_fetches=const.MODEL_HEADER_QUEUE))
        self._capped = capped

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
            if not any(a.servable for a in adverts):
                return False  # its holders left (or stopped serving it) while we waited our turn
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
                    self._prune()
                else:
                    vocab, header = got
            except NodeError as exc:
                self._failed_at[sha] = time.monotonic()
                log.warning("DIAG: model from the swarm unavailable %s", kv(model=sha[:16], error=exc.message))
                return False
            except Exception as exc:  # (a bug's: waited out as a failure, not fetched again at once, review r74)
                self._failed_at[sha] = time.monotonic()
                log.exception("DIAG: model from the swarm unavailable (an unexpected error) %s", kv(
                    model=sha[:16], error=type(exc).__name__))
                return False
            if self.catalog.by_sha(sha) is not None:
                return True  # a file of it (a download) turned up while its header was on the way
            if self._clashes(advert):
                self._failed_at[sha] = time.monotonic()
                log.warning("DIAG: model from the swarm refused: a model of its id is here %s", kv(
                    model=advert.model_id, sha=sha[:16], peer_id=advert.node_id[:8]))
                return False
            entry = ModelEntry(advert.model_id, advert.name, vocab, sha, advert.size_bytes, "swarm", header,
                               header_sha256=advert.header_sha256, header_bytes=advert.header_bytes,
                               origin_url=advert.origin_url)
            if self.catalog.add_swarm_entry(entry) is not entry:
                return self.catalog.by_sha(sha) is not None  # the id was taken meanwhile
            # until its tokenizer is read a request finds it in the catalog, not the manager: it
            # is "not ready" (ModelManager.get), and async_wait_for waits for this task
            try:
                served = await self.models.async_register(entry, whole=False)
            except (Conflict, ModelUnavailable) as exc:  # (ModelUnavailable: the node is stopping)
                self.catalog.remove_swarm_entry(entry)
                self._failed_at[sha] = time.monotonic()
                log.warning("DIAG: model from the swarm refused %s", kv(model=entry.id, error=exc.message))
                return False
            if served.tokenizer is None:
                self.catalog.remove_swarm_entry(entry)
                self.models.forget(entry)
                self._failed_at[sha] = time.monotonic()
                return False  # the manager logged why llama.cpp could not read it
            log.info("DIAG: registered model from the swarm %s", kv(
                model=entry.id, source=source, header_bytes=advert.header_bytes,
                elapsed_ms=round((time.monotonic() - started) * 1000, 1)))
            return True
