"""The `--model URL`s of a node (Node's part): their partial models opened at start, waiting at
most PARTIAL_START_OPEN_WAIT_S for their origins; one whose origin has not answered by then, or
could not be read, is opened in the background and served once it is (`--serve auto`: given to
the layer choice; `--layers`: its slice loaded)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from node import const
from node.config import is_model_url
from node.errors import InvalidRequest
from node.inference.pipeline import fixed
from node.inference.pipeline.hosted import parse_layers
from node.logs import kv
from node.models.catalog import ModelEntry

log = logging.getLogger(__name__)


class UrlModels:
    """Mixed into Node: needs its config, catalog, models, partials, slice_host, autoserve,
    contributions, note_activity and announcing."""

    config: Any
    catalog: Any
    models: Any
    partials: Any
    slice_host: Any
    autoserve: Any
    contributions: Any
    _stopping: bool
    _later_urls: list[str]
    _pending_urls: dict[str, asyncio.Task]
    _fixed_slices: list[tuple[ModelEntry, int, int]]
    _url_tasks: list[asyncio.Task]

    def note_activity(self, text: str) -> None:  # Node's
        raise NotImplementedError

    async def _async_announce(self) -> None:  # Node's
        raise NotImplementedError

    def waiting_on(self) -> list[str]:
        """What the node's start left under way (/health/ready, diagnostics): the URLs whose origin
        has not answered yet."""
        return [f"model {url}: waiting for its origin" for url in self.partials.pending()]

    async def _async_open_url_models(self) -> tuple[set[Path], set[Path]]:
        """`--model URL`: a partial model per URL in models/ (its layers are fetched when a slice
        of them loads). Returns their directories, and those with the ones not open yet (which the
        scan of models/ leaves alone). With `--serve auto`, one whose origin cannot be
        read (and nothing of it is here) is opened later, in the background (`_later_urls`); one
        whose origin has not answered within PARTIAL_START_OPEN_WAIT_S goes on in the background
        (`_pending_urls`), with `--layers` too."""
        urls = [m for m in self.config.models if is_model_url(m)]
        if urls and not (self.config.layers or self.config.serve == "auto"):
            raise InvalidRequest("a model given by URL is served in layers: add --layers A-B or --serve auto "
                                 "(`swarmllm download URL` fetches the whole file)", param="model")
        await self.partials.origins.async_load()  # a repo an earlier run looked up: its file, offline too
        dirs, self._later_urls, self._pending_urls = await self.partials.async_open_all(
            urls, later_ok=self.config.serve == "auto", wait_s=const.PARTIAL_START_OPEN_WAIT_S)
        # the directories of those not open yet are theirs too: the scan of models/ must not serve
        # them as files of the data dir (the open serves them when it ends)
        # (a Hugging Face repo never looked up has no directory known yet: `_async_serve_url_model`
        # takes it from the scan's data_dir models when its open ends)
        later = [self.partials.directory_of(url) for url in [*self._later_urls, *self._pending_urls]
                 if self.partials.origins.file_of(url)]
        return dirs, dirs | set(await asyncio.get_running_loop().run_in_executor(None, lambda: [p.resolve() for p in later]))

    async def _async_serve_url_model(self, directory: Path) -> None:
        """A `--model URL` opened after start: catalogued, registered and given to the layer choice
        (`--serve auto`) or its `--layers` slice loaded."""
        if self._stopping:
            return
        entries = await self.catalog.async_scan([(directory, "cli")])
        if not entries:  # scanned at start as a folder of models/ (a repo not known then): the URL's now
            entries = [e for e in self.catalog.entries.values() if e.partial is not None and e.path == directory
                       and e.source == "data_dir"]
            for entry in entries:
                log.info("DIAG: partial model of models/ is a --model URL's, serving it %s", kv(model=entry.id))
                entry.source = "cli"
        for entry in entries:
            if not self.models.is_registered(entry.id):
                await self.models.async_register(entry, whole=False)
            if self.autoserve is not None and self.config.serve == "auto":
                # a "Help serve" budget config.toml kept for it (not restorable at start: no such
                # model yet) is taken up, not reset to the node's budget (2026-12-07)
                await self.contributions.async_file_back(entry)
                kept = self.autoserve.model(entry.sha256)
                budget_mb = kept.budget_mb_override if kept is not None and kept.budget_mb_override is not None else 0
                await self.autoserve.async_add(entry, budget_mb, given=True)  # (an untick of Help serve keeps it)
            elif self.config.layers:
                slice_ = (entry, *parse_layers(self.config.layers, entry.n_layers))
                self._fixed_slices.append(slice_)  # a pause frees it, a resume loads it
                if self.config.contribute:
                    await self._async_load_fixed([slice_])

    async def _async_load_fixed(self, slices: list[tuple[Any, int, int]]) -> None:
        """`--layers` slices of a URL opened after start: loaded, else loaded again later."""
        retries = await fixed.async_load_at_start(self.slice_host, slices, self.note_activity)
        await self._async_announce()
        self._url_tasks += [self._load_later(slice_) for slice_ in retries]

    def _repo_refreshes(self) -> list[asyncio.Task]:
        """The Hub asked again, in the background, for the repos whose file an earlier run found."""
        origins = self.partials.origins
        return [asyncio.create_task(origins.async_refresh(url), name="refresh-model-repo")
                for url in self.config.models if is_model_url(url) and origins.remembered(url)]

    def _load_later(self, slice_: tuple[Any, int, int]) -> asyncio.Task:
        return asyncio.create_task(fixed.async_load_later(
            self.slice_host, *slice_, note=self.note_activity, announce=self._async_announce,
            paused=lambda: self.contributions.paused, stopping=lambda: self._stopping), name="load-layers-later")
