"""What this node gives the swarm, chosen while it runs: the desktop app's "Help serve this model"
(a memory budget per model, the layers chosen by the automatic layer choice) and "Pause
contributing" (no work taken for others, every slice's memory released). Kept in config.toml's
[desktop] table, restored at the next start. The admin API (`/api/admin/contribute`) and the GUI
both call this; the GUI follows `events`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from node import const
from node.config import NodeConfig
from node.datadir import save_desktop_settings
from node.errors import Conflict, InvalidRequest, ModelLoadError, NodeError
from node.inference.pipeline.autoserve import AutoServe
from node.inference.pipeline.coverage import slice_sizes
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.partials import PartialModels
from node.logs import kv
from node.models.catalog import ModelCatalog, ModelEntry
from node.observe import Observers

log = logging.getLogger(__name__)

MAX_BUDGET_MB = 1 << 24  # 16 TiB: anything above is a typo


class Contributions:
    """Per model: serve layers of it for the swarm within a budget; and the pause switch."""

    def __init__(self, config: NodeConfig, catalog: ModelCatalog, slice_host: SliceHost,
                 partials: PartialModels, *, announce: Callable[[], Awaitable[None]],
                 note: Callable[[str], None]):
        self.config = config
        self.catalog = catalog
        self.slice_host = slice_host
        self.partials = partials
        self.announce = announce
        self.note = note
        self.autoserve: AutoServe | None = None
        self._fixed: list[tuple[ModelEntry, int, int]] = []  # --layers slices: freed by a pause, loaded on resume
        self.events: Observers[[]] = Observers("contributions")  # a choice changed (the GUI re-reads summary())
        self._lock = asyncio.Lock()
        self._chosen: dict[str, str] = {}  # model id -> the sha256 its "Help serve" chose (async_stop, file gone)
        self._drains: set[asyncio.Task] = set()  # paused --layers slices waiting for their sessions to end
        # the origin connected holders name now (SwarmModels.origin_of, set once the peer network is up)
        self.origin_of: Callable[[ModelEntry], str | None] = lambda entry: None

    def attach(self, autoserve: AutoServe, fixed: list[tuple[ModelEntry, int, int]]) -> None:
        self.autoserve, self._fixed = autoserve, fixed
        autoserve.failures_changed.subscribe(self.events.emit)  # a failure kept or over: the GUI re-reads

    @property
    def paused(self) -> bool:
        return not self.config.contribute

    async def async_close(self) -> None:
        """Node.stop: end the waits of paused or changed slices for their sessions (the slice host's
        own close stops their executors next). Until 2026-12-07 none ended them: one outlived the stop,
        woke, and unloaded its slice into the executor the stop had shut down (RuntimeError, the
        weights kept)."""
        tasks = list(self._drains)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- start-up ---

    async def async_restore(self) -> None:
        """The choices config.toml kept: each model's budget, and the pause."""
        assert self.autoserve is not None
        for model_id, budget_mb in dict(self.config.contribute_models).items():
            try:
                entry = await self._async_entry(model_id)
            except NodeError as exc:  # the file went away: say so, keep the choice for when it is back
                log.warning("DIAG: contribute model not here %s", kv(model=model_id, reason=exc.message))
                continue
            await self.autoserve.async_add(entry, budget_mb)
            self._chosen[entry.id] = entry.sha256
            log.info("DIAG: contributing %s", kv(model=entry.id, budget_mb=budget_mb, source="config"))
        if self.paused:
            await self._async_release_all()

    # --- the controls ---

    async def async_help(self, model_id: str, budget_mb: int) -> dict[str, Any]:
        """Serve layers of `model_id` for the swarm within `budget_mb` (0: free memory less headroom)."""
        if isinstance(budget_mb, bool) or not isinstance(budget_mb, int) or not 0 <= budget_mb <= MAX_BUDGET_MB:
            raise InvalidRequest(f"budget_mb must be a whole number of MB from 0 (free memory) to {MAX_BUDGET_MB}",
                                 param="budget_mb")
        if self.autoserve is None:
            raise ModelLoadError("this node has no peer network: there is no swarm to help")
        async with self._lock:
            entry = await self._async_entry(model_id)
            if entry.n_layers < 1:
                raise InvalidRequest(f"{entry.id} has no transformer layers to serve", param="model")
            self.config.contribute_models = {**self.config.contribute_models, entry.id: budget_mb}
            await self.autoserve.async_add(entry, budget_mb)
            self._chosen[entry.id] = entry.sha256
            await self._async_save()
        log.info("DIAG: contributing %s", kv(model=entry.id, budget_mb=budget_mb, source="control"))
        self.note(f"helping serve {entry.id} within " + (f"{budget_mb:,} MiB" if budget_mb else "free memory"))
        self.events.emit()
        return self.summary()

    async def async_stop(self, model_id: str) -> dict[str, Any]:
        """Stop serving layers of `model_id` for the swarm (its slices are freed once idle)."""
        async with self._lock:
            chosen = self.config.contribute_models
            key = model_id if model_id in chosen else self.catalog.resolve(model_id).id
            if key not in chosen:
                raise InvalidRequest(f"this node is not helping serve {model_id}", param="model")
            self.config.contribute_models = {k: v for k, v in chosen.items() if k != key}
            entry = self.catalog.entries.get(key)
            if self.autoserve is not None:
                # by the sha256 of the model chosen, also when the catalog forgot it (its file deleted):
                # it went on being chosen, its failure shown everywhere (2026-12-07, review r27)
                sha256 = entry.sha256 if entry is not None else self._chosen.get(key)
                self._chosen.pop(key, None)
                rest = self._copy_of(sha256, key, chosen_only=True) if sha256 is not None else None
                if rest is not None:  # another file of these bytes is ticked too: its choice goes on
                    await self._async_follow_row(rest)
                elif sha256 is not None:  # (a `--serve auto` model is chosen on, at the node's budget)
                    await self.autoserve.async_end_help(sha256)
            await self._async_save()
        log.info("DIAG: contributing stopped %s", kv(model=key))
        self.note(f"stopped helping serve {key}")
        self.events.emit()
        return self.summary()

    async def async_forget(self, entry: ModelEntry) -> None:
        """The catalog dropped `entry` (its file is gone): a "Help serve" choice of it is not chosen
        any more (each retry failed on the missing file, the failure shown everywhere); it stays in
        config.toml and is taken up again when the file is back (`async_file_back`). Not ended (2026-12-07,
        review r29): a `--serve auto` model's (nothing would take it up again: it retries, and loads
        once the file is back), nor one whose content another file in the catalog still has (the
        choice keys models by sha256: deleting a copy ended the original's; its own file deleted,
        it goes on from the copy, under the copy's id in config.toml: review r30, the Swarm tab and
        the admin API said the model was not on this machine while the copy served it). A file with
        no choice returns before the lock (review r30: every file added or dropped waited behind a
        Help serve's partial-model probe or a resume's layer fetch)."""
        if self.autoserve is None or self.autoserve.model(entry.sha256) is None:
            return
        async with self._lock:
            m = self.autoserve.model(entry.sha256)
            if m is None:
                return
            other = self._copy_of(entry.sha256, entry.id)
            if other is not None:
                chosen = self.config.contribute_models
                if m.entry is entry:  # (slices loaded from it serve on: the same bytes, read through their open file)
                    log.info("DIAG: layer choice goes on from a copy %s", kv(model=entry.id, copy=other.id))
                    self.autoserve.repoint(m, other)
                elif other.id not in chosen or m.budget_mb_override == chosen[other.id]:
                    return
                if other.id not in chosen:
                    await self._async_move_choice(entry.id, other.id)
                else:  # both ticked: the original's row stays (taken up when back), the copy's budget runs
                    await self._async_follow_row(other)
            elif m.given:  # (a --model URL opened late too: review r42, was at_start)
                return
            else:
                log.info("DIAG: layer choice stops, the model's file is gone %s", kv(model=entry.id))
                await self.autoserve.async_remove(entry.sha256)
        self.events.emit()

    def _copy_of(self, sha256: str, model_id: str, *, chosen_only: bool = False) -> ModelEntry | None:
        """Another whole file in the catalog than `model_id`'s with the bytes `sha256`, one ticked "Help
        serve" first (`chosen_only`: only such a one). Not one found changed on disk (its load would be
        refused: review r32, the choice went on from it and failed) nor a partial model."""
        chosen = self.config.contribute_models
        copies = sorted((e for e in list(self.catalog.entries.values()) if e.sha256 == sha256 and e.has_file
                         and e.id != model_id and not e.changed and e.partial is None),
                        key=lambda e: e.id not in chosen)
        return next((e for e in copies if not chosen_only or e.id in chosen), None)

    async def _async_follow_row(self, entry: ModelEntry) -> None:
        """The layer choice of `entry`'s bytes goes on from `entry`, at the budget of its own Help-serve
        row (under the lock). Two files of the same bytes ticked each with a budget share one choice,
        at the budget set last: once one row is gone (its file deleted, unticked), what runs is the
        budget the remaining row shows (2026-12-07 review: it ran on at the other row's budget until a
        restart, and unticking or deleting one ended the choice of both)."""
        assert self.autoserve is not None
        m = self.autoserve.model(entry.sha256)
        if m is not None:
            self.autoserve.repoint(m, entry)
        await self.autoserve.async_add(entry, self.config.contribute_models[entry.id])
        self._chosen[entry.id] = entry.sha256

    async def _async_move_choice(self, old: str, new: str) -> None:
        """A Help-serve choice kept under `old` is kept under `new` (the same bytes, not chosen itself),
        its budget with it (under the lock)."""
        chosen = self.config.contribute_models
        if old not in chosen or new in chosen:
            return
        self.config.contribute_models = {(new if k == old else k): v for k, v in chosen.items()}
        if old in self._chosen:
            self._chosen[new] = self._chosen.pop(old)
        await self._async_save()

    async def async_file_back(self, entry: ModelEntry) -> None:
        """A model file came (back) while running: a "Help serve" choice kept for it is taken up.
        What is kept is read under the lock: read before it, an untick or a new budget queued
        ahead was undone (2026-12-07, review r29)."""
        if self.autoserve is None or entry.id not in self.config.contribute_models:
            return  # (no choice kept for it: not behind the lock, review r30; re-read under it below)
        async with self._lock:
            budget_mb = self.config.contribute_models.get(entry.id)
            if budget_mb is None or self.autoserve.model(entry.sha256) is not None:
                return
            await self.autoserve.async_add(entry, budget_mb)
            self._chosen[entry.id] = entry.sha256
        log.info("DIAG: contributing %s", kv(model=entry.id, budget_mb=budget_mb, source="file_back"))
        self.events.emit()

    def file_seen(self, entry: ModelEntry) -> None:
        """A file already catalogued was added again (Add, `swarmllm models add`): a layer choice of its
        bytes whose last load failed (its file changed on disk, and may now hold its bytes again) is
        chosen again now."""
        if self.autoserve is not None:
            self.autoserve.retry(entry.sha256)

    async def async_set_paused(self, paused: bool) -> dict[str, Any]:
        """Pause: take no work for others and free every slice (after its sessions end). Resume:
        choose layers again and reload the --layers slices."""
        async with self._lock:
            if paused == self.paused:
                return self.summary()
            self.config.contribute = not paused
            log.info("DIAG: contributing changed %s", kv(contribute=not paused))
            self.note("contributing to peers " + ("paused" if paused else "resumed"))
            # kept first: the release or the reloads below can take minutes (a session to end, a slice
            # to load) or fail, and until 2026-12-07 the choice was saved only after them — a Quit
            # meanwhile, or a reload that failed, left config.toml saying the opposite for the next start
            await self._async_save()
            if paused:
                await self._async_release_all()
            else:
                await self._async_resume()
        self.events.emit()
        return self.summary()

    async def _async_release_all(self) -> None:
        if self.autoserve is not None:
            await self.autoserve.async_pause()
        fixed = [h for h in self.slice_host.slices.values() if h.auto_budget is None]
        for hosted in fixed:
            self.slice_host.drain(hosted)
        await self.announce()  # HELLO's "pipeline" bit and the slices' adverts go now
        for hosted in fixed:  # the worker takes no new session of a peer's: the running ones end first
            task = asyncio.create_task(self._async_free_drained(hosted), name="contribute-release")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    async def async_release_changed(self, entry: ModelEntry) -> bool:
        """The models folder's watch, or a slice reading it (SliceHost._recheck), found `entry`'s file
        changed on disk (its size or mtime): the
        slices loaded from it stop being advertised and taking sessions, and are freed once their
        sessions end (at most AUTO_SERVE_DRAIN_S), so the model can leave and the file be read again
        as a new model. 2026-12-07, review r32: they served on under the old sha256, a first slice's
        embedding rows read from the new bytes, and the model never left (its drop waited for the
        slices). Hashed again first (once per change, in an executor), unless already found changed:
        only touched (the same bytes), the slices serve on and this returns True (review r34: a touch
        freed them, and a `--layers` slice was never loaded again)."""
        mine = [h for h in list(self.slice_host.slices.values()) if h.entry is entry and h.state == "loaded"]
        if not mine:
            return False
        if not entry.changed and await asyncio.get_running_loop().run_in_executor(
                None, self.catalog.same_bytes, entry):
            log.info("DIAG: model file touched on disk, the same bytes: its slices serve on %s", kv(
                model=entry.id, layers=",".join(f"{h.start}-{h.end - 1}" for h in mine)))
            return True
        log.warning("DIAG: model file changed on disk, its slices stop serving %s", kv(
            model=entry.id, layers=",".join(f"{h.start}-{h.end - 1}" for h in mine)))
        for hosted in mine:
            hosted.drained_changed = True
            self.slice_host.drain(hosted)
        await self.announce()
        for hosted in mine:
            task = asyncio.create_task(self._async_free_drained(hosted), name="contribute-changed")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        return False

    async def _async_free_drained(self, hosted: Any) -> None:
        """Free a paused --layers slice once no session uses it, or after the grace period (as the
        automatic choice frees its own): unloading it at once cut every chain running through it,
        another node's user's reply ending in an error mid-stream."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + const.AUTO_SERVE_DRAIN_S
        while hosted.state == "draining" and hosted.model is not None and hosted.model.sessions.counts()[0] \
                and loop.time() < deadline:  # noqa: ASYNC110 (the session store has no change event)
            await asyncio.sleep(const.AUTO_SERVE_DRAIN_POLL_S)
        if hosted.state == "draining":  # (a resume meanwhile kept it: it serves on)
            await self.slice_host.async_unload(hosted)

    async def _async_resume(self) -> None:
        await self.announce()
        for entry, start, end in self._fixed:
            held = self.slice_host.slices.get((entry.sha256, start, end))
            if held is None or held.state == "draining":  # (a draining one is kept, not loaded twice)
                await self.slice_host.async_load(entry, start, end)
        if self._fixed:
            await self.announce()
        if self.autoserve is not None:
            self.autoserve.resume()

    async def _async_entry(self, model_id: str) -> ModelEntry:
        """The catalog entry; a model known here only by its header (the swarm serves it) is opened
        as a partial model from the origin its holders name, so its layers can be fetched."""
        entry = self.catalog.resolve(model_id)
        entry.refuse_slices()  # a split model is served whole only
        if entry.has_file or entry.partial is not None:
            return entry
        # the origin named when its header came, else one a holder names now (a holder that downloaded
        # it may have come after one that was given the file); the partial model takes the swarm's id
        # (Conflict when the origin states another sha256; one stating none is not used: peers only)
        origin = entry.origin_url or self.origin_of(entry)
        directory = await self.partials.async_open_swarm_model(entry, origin)
        opened = next(iter(await self.catalog.async_scan([(directory, "data_dir")])), None) or \
            next((e for e in self.catalog.entries.values() if e.path == directory), None)
        if opened is None or opened.sha256 != entry.sha256:  # (not expected: the directory holds the swarm's id)
            raise Conflict(f"the partial model of {entry.id} could not be opened under the swarm's id")
        return opened

    async def async_layer_cost(self, model_id: str) -> dict[str, Any]:
        """What one layer of a model costs here (weights at the slice dtype + its KV reserve) and the
        output head: the budget slider's "≈ N layers". From the file, or the header the swarm gave."""
        entry = self.catalog.resolve(model_id)
        entry.refuse_slices()  # (slice_sizes would read part 1 alone: sizes of tensors not there)
        if entry.has_file:  # a whole file, or a partial model's directory (GgufFile reads both)
            path, header_only = entry.path, None
        else:  # known by its header alone: shapes from the cached header
            path, header_only = entry.header_path, entry.size_bytes or 1 << 62
        sizes = await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(slice_sizes, path, self.slice_host.dtype, self.slice_host.context_for(entry),
                                    header_of_size=header_only, kv_dtype=self.slice_host.kv_dtype))
        return {"model": entry.id, "n_layers": sizes.n_layers,
                "per_layer_mb": (sizes.per_layer_bytes + sizes.kv_per_layer_bytes) / 2**20,
                "head_mb": sizes.head_bytes / 2**20}

    async def _async_save(self) -> None:
        values = {"contribute": self.config.contribute, "contribute_models": dict(self.config.contribute_models)}
        try:
            await asyncio.get_running_loop().run_in_executor(None, save_desktop_settings, self.config.data_dir, values)
        except (OSError, ValueError) as exc:  # (tomllib's error is a ValueError) the choice holds for this run
            log.warning("DIAG: desktop settings not saved to config.toml, they hold until the node stops %s",
                        kv(error=str(exc)))

    # --- what it looks like ---

    def summary(self) -> dict[str, Any]:
        """{"paused", "models": [{model, budget_mb, budget_layers, with_head, serving, last_failure,
        error}], "failures": [{model, layers, reason, at, retry_at, failures}]}: per model the budget,
        the layers it fits, the slices serving now with what they did for other nodes, and the last
        failed load of its layer choice (until a later choice loads; `failures`: every model the
        choice takes, `--serve auto`'s too)."""
        out = []
        for model_id, budget_mb in self.config.contribute_models.items():
            entry = self.catalog.entries.get(model_id)
            m = self.autoserve.model(entry.sha256) if entry is not None and self.autoserve is not None else None
            serving = [{"layers": [h.start, h.end - 1], "state": h.state,
                        "fetch": {"done_bytes": h.fetch[0], "total_bytes": h.fetch[1]} if h.fetch else None,
                        "for_others": {"sessions": h.served.sessions, "tokens": h.served.tokens,
                                       "coordinators": len(h.served.coordinators)}}
                       for h in self.slice_host.slices.values() if entry is not None and h.entry.sha256 == entry.sha256]
            failure = m.last_failure if m is not None and not self.paused else None
            out.append({
                "model": model_id, "budget_mb": budget_mb,
                "effective_budget_mb": m.budget_mb if m is not None and m.budget is not None else None,
                "budget_layers": m.budget.layers if m is not None and m.budget is not None else None,
                "with_head": m.budget.with_head if m is not None and m.budget is not None else None,
                "per_layer_mb": round((m.sizes.per_layer_bytes + m.sizes.kv_per_layer_bytes) / 2**20, 2)
                if m is not None and m.sizes is not None else None,
                "serving": serving,
                "last_failure": failure.summary() if failure is not None else None,
                "error": (None if entry is not None else "the model is not on this machine now")
                or (m.budget_error if m is not None else None),
            })
        # every model the layer choice takes (--serve auto's too, not in contribute_models): its last
        # failed load, until a later choice loads
        failures = [f.summary() for f in self.autoserve.failures()] if self.autoserve is not None else []
        return {"paused": self.paused, "models": out, "failures": failures}
