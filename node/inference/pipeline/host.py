"""The slices this node serves: one SliceModel per (model hash, layer range), each on its own
single-thread executor, advertised to peers in HELLO. A chain may ask a slice for any sub-range of
its layers (`containing`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from node import const
from node.errors import FileChangedOnDisk, ModelLoadError, ModelUnavailable, NodeError
from node.inference.devices import detect_torch
from node.inference.pipeline.hosted import HostedSlice
from node.inference.pipeline.kvbudget import KvBudget
from node.inference.pipeline.partials import PartialModels
from node.inference.pipeline.perf import LocalSpeeds
from node.inference.pipeline.recheck import FileRecheck
from node.inference.placement import Placement, place
from node.inference.torchload import async_ensure_torch
from node.inference.weights.cache import WeightCache
from node.logs import kv
from node.models.catalog import ModelCatalog, ModelEntry, served_context
from node.models.changed import async_refuse_changed
from node.observe import Observers

log = logging.getLogger(__name__)


class SliceHost(FileRecheck):
    """Loads and owns this node's slices; sweeps idle KV sessions."""

    def __init__(self, *, dtype: str = "auto", n_threads: int = 0, max_ctx: int = 0, n_ctx: int = 0,
                 ctx_cap: int = 0, cpu_only: bool = False,
                 session_ttl_s: float = const.SESSION_TTL_S, kv_budget_bytes: int = const.KV_BUDGET_BYTES,
                 weight_cache: WeightCache | None = None, partials: PartialModels | None = None,
                 kv_dtype: str = "auto", catalog: ModelCatalog | None = None):
        # a file whose bytes changed since it was hashed is refused as a whole load refuses it
        # (node.models.changed); None (tests of the host alone): not checked
        self.catalog = catalog
        self.dtype = dtype
        self.kv_dtype = kv_dtype  # the slices' KV caches (SliceModel.load's kv_dtype)
        self.partials = partials  # models given by URL: their layers are fetched before a load
        self.speeds = LocalSpeeds()  # this machine's measured decode ms/layer per model and device
        self.weight_cache = weight_cache  # converted weights on disk: a second load skips the conversion
        self.cpu_only = cpu_only
        self.n_threads = n_threads
        self.max_ctx = max_ctx  # every slice's context, when set (tests); else the model's trained one
        self.n_ctx, self.ctx_cap = n_ctx, ctx_cap  # NodeConfig n_ctx / max_ctx: context_for (KV reserves)
        self.session_ttl_s = session_ttl_s
        self.kv_budget_bytes = kv_budget_bytes
        self.budget = KvBudget(self)  # admits new sessions within kv_budget_bytes, sweeps
        # by (sha256, start, end); a draining slice whose range is loaded again meanwhile stays, under
        # (sha256, start, end, its id), until freed: its sessions end on it, its memory is counted
        self.slices: dict[tuple, HostedSlice] = {}
        self._unloads: set[asyncio.Task] = set()  # slices being unloaded after their parts were dropped
        self._sweeper: asyncio.Task | None = None
        self._soon: asyncio.Task | None = None  # a sweep asked for by request_sweep
        self._sweep_again = False
        self.on_change = None  # callback() when the advertised set changes (HELLO update)
        self.events: Observers[[HostedSlice]] = Observers("slice host")  # a slice's state or fetch progress
        if partials is not None:
            partials.on_dropped = self._parts_dropped
        self.on_sweep = None  # callback() after each sweep (the worker forgets state of freed sessions)
        # callback() when peers should hear our adverts again (HELLO): a slice's ms/layer first
        # measured or clearly changed, a loading slice's fetch progress (every CLAIM_PROGRESS_ANNOUNCE_S)
        self.on_advert = None
        # callback(entry) -> awaitable True when the same bytes: a loaded slice's file changed since it was
        # hashed as it read it (Contributions.async_release_changed: hashes it again in an executor, other
        # bytes drain its slices; with models_watch_s 0 nothing else looks)
        self.on_file_changed: Callable[[ModelEntry], Awaitable[Any]] | None = None
        self._notes: set[asyncio.Task] = set()
        self.closed = False  # async_close ran (the node stopped): no slice loads any more

    def context_for(self, entry: ModelEntry) -> int:
        """Positions the auto budget reserves a session's KV for (0: the model's trained context):
        the context this node serves the model at (`served_context`, NodeConfig `n_ctx` / `max_ctx`),
        what coordinators with the defaults send, so a model trained on 131072 positions is not given
        a reserve for all of them. A session itself may still grow (by doubling) to the trained
        context: a coordinator configured for more is served, within `kv_budget_bytes`."""
        if self.max_ctx:
            return self.max_ctx
        if not (self.n_ctx or self.ctx_cap):
            return 0
        return served_context(entry.context_length, self.n_ctx, self.ctx_cap)

    def note_eval(self, hosted: HostedSlice, eval_us: int, n_tokens: int, layers: int | None = None) -> None:
        """A decode step's time on `hosted`; its ms/layer, first measured or changed by more than
        ADVERT_RATE_CHANGE since peers last heard it, is announced (their planners and layer maps
        weigh this node by it)."""
        hosted.note_eval(eval_us, n_tokens, layers)
        rate, last = hosted.ms_per_layer, hosted.advertised_ms
        if rate is None or (last is not None and 1 / const.ADVERT_RATE_CHANGE <= rate / last <= const.ADVERT_RATE_CHANGE):
            return
        hosted.advertised_ms = rate
        if self.on_advert is not None:
            self.on_advert()

    def _parts_dropped(self, entry: ModelEntry, parts: list[str]) -> None:
        """Parts of a partial model proved altered after slices were loaded from them: those
        slices stop being advertised and are unloaded (the layer choice, or a restart, loads them
        again from checked bytes)."""
        from node.models.partial import parts_for

        for hosted in list(self.slices.values()):
            if hosted.entry.sha256 == entry.sha256 and hosted.state in ("loaded", "draining") \
                    and set(parts) & set(parts_for(entry.header, hosted.start, hosted.end)):
                log.warning("DIAG: slice dropped, its layers did not match the origin %s",
                            kv(model=entry.id, layers=f"{hosted.start}-{hosted.end - 1}"))
                hosted.drained_changed = True  # a load of its range reads it afresh: the unload below frees this
                self.drain(hosted)
                task = asyncio.get_running_loop().create_task(self.async_unload(hosted),
                                                              name=f"unload-{entry.name[:12]}-{hosted.start}")
                self._unloads.add(task)
                task.add_done_callback(self._unloads.discard)

    def subscribe(self, callback: Callable[[HostedSlice], None]) -> Callable[[], None]:
        """callback(hosted) when a slice starts loading, its layers' fetch moves, it is loaded,
        fails, drains or is unloaded (the GUI's slice rows); returns an unsubscribe."""
        return self.events.subscribe(callback)

    def find(self, sha256: str, start: int, end: int) -> HostedSlice | None:
        """The loaded (or draining: its sessions finish) slice for exactly this model and range."""
        hosted = self.slices.get((sha256, start, end))
        return hosted if hosted is not None and hosted.state in ("loaded", "draining") else None

    def containing(self, sha256: str, start: int, end: int, sid: str | None = None,
                   kept: str | None = None) -> HostedSlice | None:
        """The slice of this model to run layers [start, end) with: the one already holding session
        `sid` (a draining slice too: its sessions finish), else a loaded one holding the kept
        session `kept` (to resume), else among loaded slices the exact range, else the smallest
        range that contains it."""
        fits = [s for s in self.for_model(sha256, draining=True) if s.start <= start and end <= s.end]
        if sid is not None:
            for s in fits:
                if s.model is not None and sid in s.model.sessions:
                    return s
        fits = [s for s in fits if s.state == "loaded" and not s.entry.changed and not s.checking]  # (no new session)
        if kept is not None:
            for s in fits:
                if s.model is not None and kept in s.model.sessions:
                    return s
        return min(fits, key=lambda s: (s.end - s.start, s.start), default=None)

    def for_model(self, sha256: str, *, draining: bool = False) -> list[HostedSlice]:
        """This model's loaded slices (and draining ones when asked: their sessions still end)."""
        states = ("loaded", "draining") if draining else ("loaded",)
        return [s for s in self.slices.values() if s.entry.sha256 == sha256 and s.state in states]

    def adverts(self, *, loading: bool = False) -> list[dict[str, Any]]:
        """The loaded slices' adverts; `loading`: also the slices being loaded (fetched), marked
        `"loading": true` — peers' layer choices count them (two nodes starting together do not
        both fetch the same layers), and no planner routes to them."""
        out = [s.advert() for s in self.slices.values()
               if s.state == "loaded" and not s.entry.changed and not s.checking]  # (it drains, or is hashed)
        if loading:
            # with what of its layers is here (autoserve: a claim whose fetch moves is not stale)
            out += [{**s.advert(), "loading": True, **({"fetch": list(s.fetch)} if s.fetch is not None else {})}
                    for s in self.slices.values() if s.state == "loading"]
        return out

    @property
    def ready(self) -> bool:
        """True when every configured slice is loaded (and there is at least one)."""
        return bool(self.slices) and all(s.state in ("loaded", "draining") for s in self.slices.values())

    async def async_load(self, entry: ModelEntry, start: int, end: int, *,
                         auto_budget: tuple[int, int] | None = None,
                         claim: Callable[[], Awaitable[bool]] | None = None,
                         retrying: str | None = None) -> HostedSlice:
        """Load layers [start, end) of a catalog model on a dedicated executor. `claim`: awaited
        once the slice is registered (advertised as loading) and before anything is fetched; False
        gives the slice up (state "unloaded", nothing fetched). `retrying`: the error of the failed
        load this one tries again (a failed slice of the same range being replaced: its own)."""
        if self.closed:  # (a load asked for by a task the stop does not end: the app's Resume)
            raise ModelUnavailable.stopping(entry.id)
        held = self.slices.get((entry.sha256, start, end))
        if held is not None and held.state in ("loaded", "draining") and held.model is not None \
                and not held.entry.changed and not held.drained_changed:  # (a changed file's: loaded again, checked)
            # the same range asked for again (a resume or a new budget inside the drain grace
            # period): the slice draining there is kept, with its sessions, not loaded twice
            revived = held.state == "draining"
            held.state, held.auto_budget = "loaded", auto_budget or held.auto_budget
            self.events.emit(held)
            log.info("DIAG: slice kept %s", kv(model=entry.id, layers=f"{start}-{end - 1}",
                                               was="draining" if revived else "loaded"))
            if revived and self.on_change is not None:
                self.on_change()
            return held
        if held is not None and held.state in ("loaded", "draining"):  # (of a file found changed meanwhile)
            # kept aside, not written over: its sessions finish on it, sessions_of / the sweeper / _place
            # still see it, and it is freed as it was to be (2026-12-07, review r34: orphaned)
            self.drain(held)
            del self.slices[held.key]
            self.slices[(*held.key, id(held))] = held
        if held is not None and held.state == "failed" and held.executor is not None:
            held.executor.shutdown(wait=False)  # replaced below: its idle thread stayed for ever
        if held is not None and held.state == "failed":
            retrying = held.error or retrying
        # (a retry of a failed load: the app kept showing "loading", banner hidden, between two failures)
        hosted = HostedSlice(entry, start, end, auto_budget=auto_budget, retrying=retrying)
        hosted.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"slice-{entry.name[:12]}-{start}-{end}")
        self.slices[hosted.key] = hosted
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        self.events.emit(hosted)
        kept = False
        try:
            kept = claim is None or await claim()
        finally:
            if not kept and self.slices.get(hosted.key) is hosted:  # given up, or cancelled while claiming
                del self.slices[hosted.key]
                hosted.state = "unloaded"
                hosted.executor.shutdown(wait=False)
                self.events.emit(hosted)
        if not kept:
            return hosted
        try:
            entry.refuse_slices()  # (a split model: callers refuse it earlier, saying so to the user)
            if self.catalog is not None:  # other bytes than its sha256 names: served to peers as it (2026-12-07)
                await async_refuse_changed(self.catalog, entry)
            if entry.partial is not None:
                if self.partials is None:
                    raise ModelLoadError(f"{entry.id} is a partial model and this node fetches no layers")

                announced = loop.time()  # the claim itself was announced as the slice registered

                def progress(done: int, total: int) -> None:
                    nonlocal announced
                    hosted.fetch = (done, total)
                    self.events.emit(hosted)
                    if loop.time() - announced >= const.CLAIM_PROGRESS_ANNOUNCE_S and self.on_advert is not None:
                        announced = loop.time()  # peers see the fetch move, so the claim stays theirs
                        self.on_advert()
                try:
                    await self.partials.async_fetch(entry, start, end, progress=progress)
                finally:
                    hosted.fetch = None
            await async_ensure_torch()  # the first slice: torch imported off the loop (then looked up here)
            hosted.placement = await loop.run_in_executor(hosted.executor, self._place, entry, start, end)
            hosted.ms_per_layer = self.speeds.start_from(self.for_model(entry.sha256, draining=True),
                                                         entry.sha256, str(hosted.placement.device))
            hosted.model = await self._async_open(hosted)
        except NodeError as exc:
            hosted.state, hosted.error, hosted.retrying = "failed", exc.message, None
            hosted.refused_changed = isinstance(exc, FileChangedOnDisk)
            log.error("DIAG: slice load failed %s", kv(model=entry.id, layers=f"{start}-{end - 1}", error=exc.message))
            self.events.emit(hosted)
            return hosted
        except Exception as exc:  # noqa: BLE001 - a disk error, memory, a bug: the slice fails, never stays "loading"
            hosted.state, hosted.error, hosted.retrying = "failed", f"{type(exc).__name__}: {exc}", None
            log.exception("DIAG: slice load failed %s", kv(model=entry.id, layers=f"{start}-{end - 1}",
                                                           error=hosted.error))
            self.events.emit(hosted)
            return hosted
        except asyncio.CancelledError:  # given up while its layers arrived (stop helping, a pause):
            if self.slices.get(hosted.key) is hosted:  # the parts fetched so far stay for a later load
                del self.slices[hosted.key]
            hosted.state = "unloaded"
            hosted.executor.shutdown(wait=False)
            log.info("DIAG: slice load cancelled %s", kv(model=entry.id, layers=f"{start}-{end - 1}"))
            self.events.emit(hosted)
            raise
        if self.closed:  # the node stopped while it loaded: its weights go, nothing serves it (until
            # 2026-12-07 it was "loaded" on a stopped node, its weights held and a KV sweeper left running)
            hosted.model = None
            if self.slices.get(hosted.key) is hosted:
                del self.slices[hosted.key]
            hosted.state = "unloaded"
            self.events.emit(hosted)
            log.info("DIAG: slice loaded after the stop, freed %s", kv(model=entry.id, layers=f"{start}-{end - 1}"))
            return hosted
        if self.catalog is not None:  # a touch of its file (the same bytes) does not fail its reads
            hosted.model.file.vouch = self._vouch_for(hosted, loop)
        hosted.state, hosted.retrying = "loaded", None  # (the failure it retried is over)
        self.events.emit(hosted)
        log.info("DIAG: serving slice %s", kv(model=entry.id, layers=f"{start}-{end - 1}", n_layers=entry.n_layers,
                                              elapsed_ms=int((time.monotonic() - started) * 1000)))
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._async_sweep_loop(), name="kv-sweeper")
        if self.on_change is not None:
            self.on_change()
        return hosted

    async def _async_open(self, hosted: HostedSlice):
        """SliceModel.load on the slice's executor, of the file as it was hashed (`expect`: review r36, a
        file replaced between the check and the open loaded under the old sha256). One touched as it
        loads (FileChangedWhileOpen) is checked again (hashed off the loop: other bytes refuse it) and
        loaded again: review r36, a touch failed the load, and a `--layers` slice served nothing."""
        from node.inference.slice import SliceModel
        from node.inference.weights.gguf_file import FileChangedWhileOpen

        entry, loop, tries = hosted.entry, asyncio.get_running_loop(), 1
        while True:
            expect = entry.hashed_stat if self.catalog is not None and entry.partial is None else None
            try:
                return await loop.run_in_executor(hosted.executor, functools.partial(
                    SliceModel.load, entry.path, hosted.start, hosted.end, dtype=self.dtype,
                    device=hosted.placement.device, n_threads=self.n_threads or None, max_ctx=self.max_ctx or None,
                    name=entry.id, cache=self.weight_cache, sha256=entry.sha256, kv_dtype=self.kv_dtype, expect=expect))
            except FileChangedWhileOpen:
                if expect is None:
                    raise
            log.info("DIAG: slice's file changed on disk as it loaded, checking it again %s",
                     kv(model=entry.id, layers=f"{hosted.start}-{hosted.end - 1}"))
            await async_refuse_changed(self.catalog, entry)  # (other bytes: FileChangedOnDisk)
            if tries >= const.SLICE_LOAD_TOUCHED_TRIES:  # (review r40: it said "written over", and stayed failed)
                hosted.touched = True  # (a --layers slice is loaded again later: fixed.py)
                raise ModelLoadError(f"the file of {entry.id} was touched on disk while it loaded, {tries} times "
                                     "(the same bytes each time it was hashed again): it is loaded again later")
            tries += 1

    def drain(self, hosted: HostedSlice) -> None:
        """Stop advertising a slice (a move left it); its running sessions go on until unloaded."""
        if hosted.state == "loaded":
            hosted.state = "draining"
            self.events.emit(hosted)
            if hosted.model is not None and hosted.executor is not None:
                hosted.executor.submit(hosted.model.sessions.free_kept)  # never resumed on a draining slice
            if self.on_change is not None:
                self.on_change()

    async def async_unload(self, hosted: HostedSlice, *, keep_parts: bool = False) -> None:
        """Forget a slice and free its weights and sessions on its executor (after steps in flight).
        `keep_parts`: a partial model's layer files stay (a pause, a new budget: they load again)."""
        if hosted.state == "unloaded":
            return  # (a release and the evaluation that loaded it may both get here)
        for key in [k for k, s in self.slices.items() if s is hosted]:  # (its own key, or one kept aside)
            del self.slices[key]
        self.speeds.remember(hosted)
        was = hosted.state
        hosted.state = "unloaded"
        self.events.emit(hosted)
        if was == "loaded" and self.on_change is not None:
            self.on_change()
        if hosted.executor is not None:
            def free() -> None:
                # the last reference to its weights, KV caches and open file: refcounting frees them here,
                # nothing of theirs is in a reference cycle (2026-12-07: a full gc.collect() here held the
                # GIL, so the event loop, for its heap walk: 0.13 s on a quiet node, 749 ms in CI)
                hosted.model = None
                if hosted.vocab is not None:
                    hosted.vocab.close()
                    hosted.vocab = None

            # cancelled (the node's stop cancels the tasks that free drained slices) while the free
            # waits behind a step on the slice's thread: it still runs, and the thread then ends.
            # Until 2026-12-07 the free was cancelled with it and the executor never shut down: the
            # slice, gone from self.slices, kept its weights and a parked thread for good.
            freed = asyncio.wrap_future(hosted.executor.submit(free))
            try:
                await asyncio.shield(freed)
            finally:
                hosted.executor.shutdown(wait=False)
        log.info("DIAG: slice unloaded %s", kv(model=hosted.entry.id, layers=f"{hosted.start}-{hosted.end - 1}",
                                               was=was))
        if not keep_parts:  # its parts no other slice uses go
            await self.async_trim_parts(hosted.entry)

    def free_sessions_of(self, coordinator: str, *, restarted: bool = False) -> None:
        """Drop the sessions in use that `coordinator` opened on every slice (its link is gone),
        on each slice's executor, after its queued steps; `restarted` (it came back as a new
        process): its kept ones too, with one DIAG line per slice that held any."""
        for hosted in list(self.slices.values()):
            if hosted.model is not None and hosted.executor is not None and hosted.state in ("loaded", "draining"):
                if restarted:
                    hosted.executor.submit(_free_restarted, hosted, coordinator)
                else:
                    hosted.executor.submit(hosted.model.sessions.free_coordinator, coordinator)

    async def async_trim_parts(self, entry: ModelEntry) -> None:
        """Delete a partial model's parts that no slice here (loading, loaded or draining) reads."""
        if entry.partial is not None and self.partials is not None:
            await self.partials.async_trim(entry, lambda: [(s.start, s.end) for s in self.slices.values()
                                                           if s.entry.sha256 == entry.sha256])

    def _place(self, entry: ModelEntry, start: int, end: int) -> Placement:
        """GPU if torch sees one with room (f16 weights), else the CPU with the reason (blocking)."""
        from node.inference.slice.model import estimate_bytes

        estimated_mb = estimate_bytes(entry.path, start, end, "f16") // 2**20 + 128  # + KV and buffers
        committed: dict[int, int] = {}
        for other in self.slices.values():
            p = other.placement
            if p is not None and p.gpu_index is not None and other.state in ("loaded", "draining"):  # (still held)
                committed[p.gpu_index] = committed.get(p.gpu_index, 0) + p.estimated_mb
        return place(f"{entry.id}[{start}-{end - 1}]", estimated_mb, detect_torch(), cpu_only=self.cpu_only,
                     committed_mb=committed)

    async def _async_sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(const.SESSION_SWEEP_INTERVAL_S)
            try:
                await self.async_sweep()
            except Exception:  # a sweep that fails must not end the sweeping (KV would grow unbounded)
                log.exception("DIAG: KV session sweep failed; the next one runs as planned")

    async def async_sweep(self) -> list[str]:
        """Free sessions idle past the TTL, then LRU ones over the KV budget (kvbudget.py)."""
        freed = await self.budget.async_sweep()
        for hosted in self.slices.values():
            coordinators = hosted.served.coordinators
            if len(coordinators) > const.SERVED_COORDINATORS_MAX:
                for key in sorted(coordinators, key=coordinators.get)[: len(coordinators) - const.SERVED_COORDINATORS_MAX]:
                    del coordinators[key]
        if self.on_sweep is not None:
            self.on_sweep()
        return freed

    def session_count(self) -> int:
        """KV sessions in use (not the kept ones, see kept_count)."""
        return sum(s.model.sessions.counts()[0] for s in self.slices.values() if s.model is not None)

    def kv_bytes(self) -> int:
        """Bytes held by every slice's KV caches (kept sessions too)."""
        return sum(s.model.sessions.total_bytes() for s in self.slices.values() if s.model is not None)

    def request_sweep(self) -> None:
        """Sweep soon (loop thread): a session was kept, the KV budget must hold now, not at the
        next periodic sweep."""
        self._sweep_again = True  # one in progress may have passed the slice already: it runs once more
        if self._soon is None or self._soon.done():
            self._soon = asyncio.get_running_loop().create_task(self._async_sweep_soon(), name="kv-sweep")

    async def _async_sweep_soon(self) -> None:
        while self._sweep_again:
            self._sweep_again = False
            try:
                await self.async_sweep()
            except Exception:
                log.exception("DIAG: KV session sweep failed; the next one runs as planned")

    def kept_count(self) -> int:
        """Finished sessions kept for their coordinators' next turn (prefix reuse on chains)."""
        return sum(s.model.sessions.counts()[1] for s in self.slices.values() if s.model is not None)

    async def async_close(self) -> None:
        """Stop the sweeper and the executors; a load under way is freed when it ends (`closed`)."""
        self.closed = True
        for task in (self._sweeper, self._soon, *self._unloads, *self._notes):
            if task is not None:
                task.cancel()
        for hosted in self.slices.values():
            if hosted.executor is not None:
                hosted.executor.shutdown(wait=False, cancel_futures=True)


def _free_restarted(hosted: HostedSlice, coordinator: str) -> None:
    """Executor: free every session (in use and kept) a restarted coordinator's old process had here."""
    gone = hosted.model.sessions.free_coordinator(coordinator, "coordinator_restarted", kept=True)
    if gone:
        log.info("DIAG: KV sessions of a restarted coordinator freed %s", kv(
            peer_id=coordinator[:8], count=len(gone), kept=sum(1 for s in gone if s.kept_for is not None),
            bytes_freed=sum(s.nbytes for s in gone), layers=f"{hosted.start}-{hosted.end - 1}"))
