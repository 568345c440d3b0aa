"""ModelManager: the models this node serves whole, their state and admission queue (their placement
and memory: whole_sizing.WholeSizing).

One `ServedModel` per catalog entry. A model is loaded on start-up and again on demand after an
unload (logged as on-demand loading). Up to `max_concurrent` requests use a model at once (one
llama.cpp batch); more wait their turn on the model's `ModelSlots`; that wait is the trace's queue_ms. Every state change is published to observers (the GUI's
models table) on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from node.config import NodeConfig
from node.errors import Conflict, ModelLoadError, ModelNotFound, ModelUnavailable, NodeError, Overloaded
from node.inference.devices import DeviceInventory
from node.inference.llama_engine import LlamaEngine
from node.inference.load_failure import LoadFailure
from node.inference.memory_estimate import MemoryEstimate
from node.inference.model_slots import ModelSlots
from node.inference.placement import Placement
from node.inference.served import ServedModel, untagged
from node.inference.tokenizer import ModelTokenizer
from node.inference.whole_sizing import WholeSizing
from node.logs import kv
from node.models.catalog import ModelCatalog, ModelEntry, served_context
from node.models.changed import async_refuse_changed
from node.observe import Observers

log = logging.getLogger(__name__)

ModelObserver = Callable[[str, ServedModel], None]
SwarmLookup = Callable[[str], Awaitable[bool]]  # wait for a model the swarm serves to be registered


class ModelManager:
    """Owns ServedModels; loads, unloads and admits requests."""

    def __init__(self, config: NodeConfig, catalog: ModelCatalog):
        self.config = config
        self.catalog = catalog
        self._served: dict[str, ServedModel] = {}  # by model id
        self._registering: dict[str, ServedModel] = {}  # by model id, while the tokenizer is read
        self._observers: Observers[[str, ServedModel]] = Observers("model")
        self.swarm_lookup: SwarmLookup | None = None  # swarm_models.SwarmModels.async_wait_for
        self.sizing = WholeSizing(config)  # placement and memory of the whole models
        self.closed = False  # async_close ran (the node is stopping): nothing loads any more
        self._placing = asyncio.Lock()  # one placement at a time; held by a GPU load until it ends (_load)

    @property
    def detect_devices(self) -> Callable[[], DeviceInventory]:
        """The GPUs llama.cpp can use (`WholeSizing.detect_devices`; tests put a fake GPU here)."""
        return self.sizing.detect_devices

    @detect_devices.setter
    def detect_devices(self, detect: Callable[[], DeviceInventory]) -> None:
        self.sizing.detect_devices = detect

    # --- observers ---

    def subscribe(self, observer: ModelObserver) -> Callable[[], None]:
        """Call observer(event, model) on every change ("added", "changed", "removed"); returns an unsubscribe."""
        return self._observers.subscribe(observer)

    # --- registry ---

    async def async_register(self, entry: ModelEntry, *, whole: bool = True) -> ServedModel:
        """Add a catalog entry and read its tokenizer (vocab-only load, off the loop).

        A registered id is never replaced (Conflict), except on purpose: a file of a model known
        here by its header only (a download, a scan) replaces that header-only registration,
        once the catalog has the file's entry under the id. A header-only (swarm) entry must be
        the catalog's entry for its id, so a peer's advert can never stand in for a model here."""
        known = self._served.get(entry.id) or self._registering.get(entry.id)
        in_catalog = self.catalog.entries.get(entry.id) is entry
        if known is not None and not (entry.has_file and not known.entry.has_file and in_catalog):
            raise Conflict(f"model {entry.id} is registered already; it is not replaced")
        if not entry.has_file and not in_catalog:
            raise Conflict(f"model {entry.id} from the swarm is not this node's catalog entry for that id")
        served = ServedModel(entry, whole=whole)
        served.lock = ModelSlots(self.config.max_concurrent)
        if not whole:
            served.state = "slices" if entry.has_file else "swarm"  # swarm: only its header is here
        # visible to requests only once its tokenizer is read: a request never sees it half made
        self._registering[entry.id] = served
        try:
            served.tokenizer = await asyncio.get_running_loop().run_in_executor(None, ModelTokenizer, entry.tokenizer_path)
        except ModelLoadError as exc:
            served.state, served.error = "failed", exc.message
            served.failure = LoadFailure(exc.message, None, time.time(), vocabulary=True)  # stands for good
            log.error("model %s cannot be served: %s", entry.id, exc.message)
        finally:
            if self._registering.get(entry.id) is served:
                del self._registering[entry.id]
        served.n_ctx = self._context_for(entry)
        if whole and entry.has_file:  # (placed as a load would place it now, GPUs unread: WholeSizing)
            placed = await self.sizing.async_place(entry, self._committed_mb(), dry=True, read_memory=False)
            served.memory = self._estimate(served, placed.n_gpu_layers if placed is not None else 0)
        now = self._served.get(entry.id)
        taken = now is not None and now is not known and not (entry.has_file and not now.entry.has_file)
        if taken or self.closed:  # a file's registered meanwhile stays; none after the stop (2026-12-07: a
            # header's replaced a download's read meanwhile; one registered after the stop kept its vocabulary)
            if served.tokenizer is not None:
                served.tokenizer.close()
            if self.closed:
                raise ModelUnavailable.stopping(entry.id)
            raise Conflict(f"model {entry.id} was registered meanwhile; it is not replaced")
        self._served[entry.id] = served
        self._observers.emit("added", served)
        return served

    def forget(self, entry: ModelEntry, *, removed: bool = False) -> bool:
        """Drop the registration of this very entry (a swarm model whose tokenizer failed; with
        `removed`, a model whose file is gone: observers hear "removed"); True if it was registered.
        Its tokenizer is not closed: a request that holds the model may still use it."""
        served = self._served.get(entry.id)
        if served is None or served.entry is not entry:
            return False
        del self._served[entry.id]
        if removed:
            self._observers.emit("removed", served)
        return True

    def registered(self, model_id: str) -> ServedModel | None:
        """The model registered under exactly this id, if any."""
        return self._served.get(model_id)

    def is_registered(self, model_id: str) -> bool:
        """Whether a model of exactly this id is registered here (or its tokenizer is being read)."""
        return model_id in self._served or model_id in self._registering

    def _estimate(self, served: ServedModel, n_gpu_layers: int = 0) -> MemoryEstimate:
        """What a load of `served` takes (weights + KV at n_ctx), the part on a GPU with `n_gpu_layers`."""
        return self.sizing.estimate(served.entry, served.n_ctx, n_gpu_layers)

    def _committed_mb(self) -> dict[int, int]:
        """Per GPU index, the megabytes admitted there for the models loaded (or still unloading)."""
        committed: dict[int, int] = {}
        for other in self._served.values():
            if other.placement is not None and other.placement.gpu_index is not None \
                    and other.state in ("loaded", "unloading"):  # (its weights are there until freed)
                committed[other.placement.gpu_index] = committed.get(other.placement.gpu_index, 0) + other.placement.estimated_mb
        return committed

    async def async_estimate_load(self, model_id: str) -> dict[str, Any] | None:
        """What a load of a whole model not loaded would take, placed as that load would place it
        now (the Models tab's fit); its summary follows ("changed"). None for anything else."""
        served = self._served.get(model_id)
        if served is None or served.memory is None or served.state not in ("unloaded", "failed"):
            return None
        placed = await self.sizing.async_place(served.entry, self._committed_mb(), dry=True)
        if served.state not in ("unloaded", "failed"):  # a load began meanwhile: it placed it itself
            return served.memory.as_dict()
        estimate = self._estimate(served, placed.n_gpu_layers)
        if estimate != served.memory:
            served.memory = estimate
            self._observers.emit("changed", served)
        return estimate.as_dict()

    def _context_for(self, entry: ModelEntry) -> int:
        return served_context(entry.context_length, self.config.n_ctx, self.config.max_ctx)

    def get(self, model_id: str) -> ServedModel:
        """The served model for an id, name or hash prefix (404 if unknown here), `untagged`: `:latest`
        after it is Ollama's listing of it (/api/tags), which apps then send to /v1 too (GitHub Copilot
        Chat's Ollama connection: review r46, every /v1 route was a 404); another tag is another model."""
        asked, model_id = model_id, untagged(model_id)
        try:
            entry = self.catalog.resolve(model_id)
        except ModelNotFound as exc:  # named as the client sent it (review r47: `nosuch` for `nosuch:latest`)
            if asked == model_id:
                raise
            raise ModelNotFound(exc.message.replace(f"`{model_id}`", f"`{asked}`"), param=exc.param,
                                model=asked if exc.model is not None else None) from None
        served = self._served.get(entry.id)
        if served is None:  # catalogued a moment before its registration (a scan, a swarm header)
            raise ModelNotFound(f"The model `{model_id}` is not ready on this node yet", param="model")
        return served

    async def async_get(self, model_id: str) -> ServedModel:
        """get(), or, for a model only peers hold whose header is on its way, once it is here."""
        try:
            return self.get(model_id)
        except ModelNotFound:
            if self.swarm_lookup is None or not await self.swarm_lookup(untagged(model_id)):
                raise
        return self.get(model_id)

    def all(self) -> list[ServedModel]:
        """Every registered model: held whole, or registered for its tokenizer beside our slices."""
        return list(self._served.values())

    def whole_models(self) -> list[ServedModel]:
        """The models this node runs whole with llama.cpp (not the slice-only registrations)."""
        return [m for m in self._served.values() if m.whole]

    @property
    def ready(self) -> bool:
        """True when a whole model is loaded and none is still loading."""
        whole = self.whole_models()
        return any(m.state == "loaded" for m in whole) and not any(m.state == "loading" for m in whole)

    # --- load / unload ---

    async def async_load(self, model_id: str, *, after_unload: bool = False) -> ServedModel:
        """Load a model (idempotent; concurrent callers share one load). While an unload is under way
        the caller either waits for it and loads again (`after_unload`: the admin API, the GUI) or,
        holding the model (a request: the unload waits for it), is told the model is going away.
        A model whose load failed is tried again only by such a caller or once its file changed;
        a request gets the failure (`ModelLoadFailed`) at once."""
        served = self.get(model_id)
        while served.unloading is not None:
            if not after_unload:
                raise ModelUnavailable(f"model {served.id} is being unloaded; retry shortly")
            await asyncio.shield(served.unloading)
        if served.state == "loaded":
            return served
        if not served.whole:
            raise Conflict(f"model {served.id} is served here as slices only; it is not loaded whole")
        if served.tokenizer is None:
            raise self.unservable(served)
        seen = served.state
        if not after_unload:
            await self.async_refuse_failed(served)
        await async_refuse_changed(self.catalog, served.entry)  # other bytes than its id names: 503
        if self.closed:  # closed during the checks above: a load now would never be freed
            raise self.unservable(served)
        if served.state != seen or served.unloading is not None:  # a load ended or an unload began meanwhile:
            # looked at again (2026-12-07: a second load began, its engine replacing the first unclosed)
            return await self.async_load(model_id, after_unload=after_unload)
        if served.load_task is None or served.load_task.done():
            served.load_task = asyncio.create_task(self._load(served), name=f"load-{served.id}")
        task = served.load_task
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:  # the load, not this caller, cancelled (the stop): a 503, not a cut
            me = asyncio.current_task()
            if not task.cancelled() or (me is not None and me.cancelling()):
                raise
            raise self.unservable(served) from None
        if served.state != "loaded":
            if self.closed:  # (the load ended after the stop and was freed)
                raise self.unservable(served)
            if served.unloading is not None or served.failure is None:  # a forced unload came first
                raise ModelUnavailable(f"model {served.id} is being unloaded; retry shortly")
            raise served.failure.error(served.id)
        return served

    def unservable(self, served: ServedModel) -> NodeError:
        """What a request for a model without a tokenizer is told: its recorded failure (500
        `model_load_failed`, not retried: no load can succeed without a vocabulary), or a 503 when
        it has none (its tokenizer was closed: the node is stopping). Once the node stops, always
        that 503 (review r60: a load retried at the stop answered its earlier failure's 500)."""
        if served.failure is not None and not self.closed:
            return served.failure.error(served.id)
        if self.closed or not served.error:
            return ModelUnavailable.stopping(served.id)
        return ModelUnavailable(f"model {served.id} cannot be served: {served.error}")

    async def async_refuse_failed(self, served: ServedModel) -> None:
        """Raise the recorded failure of a model whose load failed while it still stands (the
        same file, a stat off the loop; see LoadFailure.lapsed); return when it has none or it
        lapsed (a request then loads the model again)."""
        failure = served.failure
        if served.tokenizer is None:
            raise self.unservable(served)
        if served.state != "failed" or failure is None:
            return
        why = await asyncio.get_running_loop().run_in_executor(None, failure.lapsed, served.entry.path)
        if why is None:
            raise failure.error(served.id)
        if not failure.retry_said:
            failure.retry_said = True
            log.info("DIAG: failed model loaded again by a request %s", kv(model=served.id, why=why))

    async def async_load_on_demand(self, served: ServedModel, **ids: str) -> None:
        """A request's load of a model it holds that is not loaded (`ids`: its request_id or sid
        for the log): said as on-demand loading only when a load is what happens."""
        if served.state == "loaded":
            return
        if served.unloading is not None:
            log.info("Model is being unloaded, refusing the request %s", kv(**ids, model=served.id))
        elif served.state != "failed" or served.failure is None:
            log.info("On-demand loading: model is on disk but not loaded %s", kv(**ids, model=served.id))
        await self.async_load(served.id)

    async def _load(self, served: ServedModel) -> None:
        served.state, served.error = "loading", None
        self._observers.emit("changed", served)
        # one placement at a time, and a load placed on a GPU holds the turn until its weights are there
        # (loaded: committed; failed: freed): a second load then sees that GPU as it is. 2026-12-07: two
        # loads at once both took a GPU that holds one (neither counted the other); review r60: counting
        # a load under way as well as the free memory it had already taken sent a fitting one to the CPU
        await self._placing.acquire()
        try:
            placed = await self.sizing.async_place(served.entry, self._committed_mb())
        except BaseException:
            self._placing.release()
            raise
        served.placement = placed
        if placed.gpu_index is None:
            self._placing.release()
        try:
            await self._load_placed(served, placed)
        finally:
            if placed.gpu_index is not None:
                self._placing.release()

    async def _load_placed(self, served: ServedModel, placed: Placement) -> None:
        if served.memory is not None:  # what lies on the GPU does not take RAM (the Memory column, the fit)
            served.memory = self._estimate(served, placed.n_gpu_layers)
        device, reason = placed.device, placed.cpu_placement_reason
        served.device, served.cpu_placement_reason = device, reason
        concurrent, cache_seqs, spare = self.sizing.sequences(served.n_ctx)
        engine = LlamaEngine(served.id, served.entry.path, n_ctx=served.n_ctx,
                             n_threads=self.config.n_threads, n_gpu_layers=placed.n_gpu_layers,
                             max_concurrent=concurrent, kv_cache_seqs=cache_seqs, kv_spare=spare,
                             speculative_max_draft=self.config.speculative_max_draft,
                             flash_attention=self.config.flash_attention)
        try:
            await engine.async_run(engine.load)
        except asyncio.CancelledError:  # the node stopping (async_close): the load goes on in its thread
            engine.abandon()
            served.state = "unloaded"
            raise
        except NodeError as exc:
            engine.shutdown()  # (the file's identity is the one the load read: one replaced since is tried again)
            served.failure = LoadFailure(exc.message, engine.identity, time.time())
            served.state, served.error = "failed", exc.message
            served.device, served.cpu_placement_reason, served.placement = None, None, None  # none placed
            log.error("DIAG: load_model failed model=%s error=%s", served.id, exc.message)
            self._observers.emit("changed", served)
            return
        if self.closed:  # (a load is cancelled by the close; this guards its last step's race)
            engine.abandon()
            served.state = "unloaded"
            return
        served.engine, served.failure = engine, None
        served.state, served.loaded_at = "loaded", time.time()
        log.info("model-worker: Model loaded model=%s device=%s%s", served.id, device,
                 f" cpu_placement_reason={reason}" if reason else "")
        self._observers.emit("changed", served)

    async def async_unload(self, model_id: str, *, force: bool = False) -> ServedModel:
        """Free a model's weights; refused (409) while a request is using it unless forced, which
        cancels the running generations (Node.async_unload_model first ends their requests with an
        error, so a client does not take the text so far for a finished reply)."""
        served = self.get(model_id)
        if not served.whole:
            raise Conflict(f"model {served.id} is served here as slices only; there is nothing whole to unload")
        waited = False
        while served.unloading is not None:  # one unload at a time: a second waits for the first
            waited = True  # (two that overlapped, one cancelled, closed a load made between them and
            await asyncio.shield(served.unloading)  # left the first engine's weights loaded for good)
        if served.load_task is not None and not served.load_task.done():
            await asyncio.shield(served.load_task)
        if waited and served.engine is None:
            return served  # the unload waited for did it
        if (served.busy or served.waiting) and not force:
            raise Conflict(f"model {served.id} is in use by {served.lock.holders + served.waiting} request(s)")
        for job in list(served.running):  # force: stop the generation now rather than wait for it
            job.cancel.set()
        # "unloading" from now until the weights are freed: /v1/models, the admin API and peers no
        # longer see it loaded, and a load asked for meanwhile comes after this unload (until
        # 2026-12-06 such a load answered "loaded" at once and the model was unloaded after it)
        done = asyncio.get_running_loop().create_future()
        was, served.unloading = served.state, done
        if served.engine is not None:
            served.state = "unloading"
            self._observers.emit("changed", served)
        try:
            async with served.lock.exclusive():
                engine, served.engine = served.engine, None
                was_on = served.device
                try:
                    if engine is not None:  # (cancelled, its client gone: the close still runs)
                        await engine.async_close()
                finally:  # (cancelled too: review r60, the device and placement stayed, no retry was allowed)
                    # (a model whose load failed stays "failed": its failure still stands)
                    served.state, served.loaded_at = "unloaded" if served.failure is None else "failed", None
                    if engine is not None:  # its weights are freed (or going): it is placed nowhere now
                        served.device, served.cpu_placement_reason, served.placement = None, None, None
                        self._memory_freed(served)
                        log.info("Model worker stopped and its memory budget released model=%s device=%s",
                                 served.id, was_on)
        finally:
            if served.unloading is done:
                served.unloading = None
            done.set_result(None)
            if served.state == "unloading":  # cancelled before the weights were freed
                served.state = was if served.engine is not None else "unloaded"
            self._observers.emit("changed", served)  # (cancelled or not)
        return served

    def _memory_freed(self, freed: ServedModel) -> None:
        """`freed`'s weights are gone: a load that failed for want of memory may succeed now, so
        the next request for such a model tries again (a vocabulary that could not be read stays)."""
        for other in self._served.values():
            if other is not freed and other.state == "failed" and other.failure is not None \
                    and not other.failure.vocabulary and not other.failure.memory_freed:
                other.failure.memory_freed = True
                log.info("DIAG: failed model may load now, memory was freed %s", kv(model=other.id, freed=freed.id))

    async def async_check_file(self, served: ServedModel) -> None:
        """503 for a loaded model whose file was cut or rewritten in place since its load (a stat,
        off the loop): running it would read the mapped file and kill the node (SIGBUS). Until
        2026-12-06 the next request did; now it is refused until the model is loaded again."""
        engine = served.engine
        if engine is None:
            return
        changed = await asyncio.get_running_loop().run_in_executor(None, engine.file_changed)
        if changed is None:
            return
        why = (f"the file of model {served.id} ({engine.path}) was changed on disk while it was loaded ({changed}): "
               "put the file back, or unload and load the model again")
        if not engine.file_change_said:
            engine.file_change_said = True
            log.warning("DIAG: model file changed while loaded, refusing its requests %s",
                        kv(model=served.id, path=engine.path, change=changed))
        raise ModelUnavailable(why)

    async def async_load_all(self) -> None:
        """Load every registered model (failures are recorded, not raised)."""
        for served in self.whole_models():
            if served.tokenizer is not None:
                try:
                    await self.async_load(served.id)
                except NodeError:
                    pass

    async def async_close(self) -> None:
        """Unload everything and free tokenizers (shutdown). A load under way is given up on: its
        engine is freed when its thread is done with it (LlamaEngine.abandon); one asked for from now
        on is refused (503: the node is stopping). Until 2026-12-07 either kept its weights and its
        thread after the stop."""
        self.closed = True
        for served in self.all():
            if served.load_task is not None and not served.load_task.done():
                served.load_task.cancel()
            engine, served.engine = served.engine, None
            if engine is not None:
                await engine.async_close()
            if served.tokenizer is not None:
                served.tokenizer.close()
                served.tokenizer = None
            served.state = "unloaded"

    # --- admission ---

    def admit(self, served: ServedModel) -> None:
        """Refuse early (429) when the model's queue is full."""
        if served.waiting >= self.config.max_queue_per_model:
            raise Overloaded(f"model {served.id} has {served.waiting} requests waiting; try again later")

    def note_entry(self, entry: ModelEntry) -> None:
        """Something shown of this very entry changed (its file gone, back): its row follows."""
        served = self._served.get(entry.id)
        if served is not None and served.entry is entry:
            self._observers.emit("changed", served)

    def mark(self, served: ServedModel, *, waiting: int = 0, busy: bool | None = None) -> None:
        """Adjust queue counters and publish the change."""
        served.waiting += waiting
        if busy is not None:  # a request started or ended: busy while any request holds the model
            served.busy = served.lock.holders > 0
            served.last_used = time.time()
        if self._served.get(served.id) is served:  # (a request that outlived its model's removal: no ghost row)
            self._observers.emit("changed", served)
