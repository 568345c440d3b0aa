"""PartialModels: the slice host's side of models given by URL (node/models/partial).

`async_open(url)` opens (or reuses) the partial model of a `--model URL` in models/; the slice
host calls `async_fetch(entry, start, end)` before it loads a slice of a partial model (the
missing tensors come from the origin) and `async_trim(entry, ranges)` after it unloaded one (the
parts no remaining range uses are deleted). One fetch or trim at a time. The URL as given, with
its query (a signed URL's credentials), is kept here in memory only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from node import const
from node.inference.weights.cache import WeightCache
from node.logs import kv
from node.models.catalog import ModelEntry
from node.models.download import file_name_for, resolve_url
from node.models.download.urls import display_url
from node.models.partial import PartialStore, async_fetch_parts, async_open_partial, parts_for
from node.models.partial.layout import dir_name

log = logging.getLogger(__name__)


class PartialModels:
    """Partial models' layers: opened, fetched before a slice loads, trimmed after an unload."""

    def __init__(self, models_dir: Path, weight_cache: WeightCache | None = None,
                 note: Callable[[str], None] = lambda _text: None):
        self.models_dir = models_dir
        self.weight_cache = weight_cache
        self.note = note  # a line for the node's activity list (the GUI's status)
        self._lock = asyncio.Lock()
        self._urls: dict[Path, str] = {}  # partial model directory -> the URL as given

    async def async_open(self, url: str) -> Path:
        """The directory of url's partial model (its header probed; nothing else fetched but the
        tiny `globals` part). DownloadFailed when the origin cannot be read and nothing is here."""
        resolved = resolve_url(url)
        directory = self.models_dir / dir_name(display_url(resolved), file_name_for(resolved, None))
        store, manifest = await async_open_partial(url, directory)
        log.info("DIAG: partial model opened %s", kv(url=manifest.origin_url, dir=directory.name,
                                                     held=manifest.describe()))
        resolved_dir = await asyncio.get_running_loop().run_in_executor(None, store.dir.resolve)
        self._urls[resolved_dir] = url
        return resolved_dir

    async def async_fetch(self, entry: ModelEntry, start: int, end: int) -> None:
        """The tensors of layers [start, end) of a partial model, from its origin."""
        assert entry.partial is not None
        manifest, parts, label = entry.partial, parts_for(entry.header, start, end), f"{start}-{end - 1}"
        last = [0.0]

        def progress(done: int, total: int) -> None:  # INFO every PARTIAL_PROGRESS_LOG_S (the CLI's), else DEBUG
            now = time.monotonic()
            level = logging.INFO if now - last[0] >= const.PARTIAL_PROGRESS_LOG_S or done >= total else logging.DEBUG
            if level == logging.INFO:
                last[0] = now
            log.log(level, "DIAG: fetching layers %s", kv(
                model=entry.id, layers=label, done_mb=round(done / 1e6, 1), of_mb=round(total / 1e6, 1),
                percent=round(100 * done / max(total, 1))))

        async with self._lock:
            if not manifest.covers(parts):
                self.note(f"fetching layers {label} of {entry.id} from its origin")
            stats = await async_fetch_parts(PartialStore(entry.path), manifest, parts, progress=progress,
                                            url=self._urls.get(entry.path))
            if stats.restarts and self.weight_cache is not None:  # the same id, other bytes
                await asyncio.get_running_loop().run_in_executor(None, self.weight_cache.forget, entry.sha256)
        if stats.wire_bytes:
            self.note(f"fetched layers {label} of {entry.id}: {stats.wire_bytes / 1e6:.1f} MB")

    async def async_trim(self, entry: ModelEntry, ranges: list[tuple[int, int]]) -> None:
        """Delete the parts of a partial model that none of `ranges` (its slices still here) uses."""
        assert entry.partial is not None
        keep = {part for start, end in ranges for part in parts_for(entry.header, start, end)}
        drop = sorted(p for p in entry.partial.complete if p not in keep)
        if not drop:
            return
        async with self._lock:
            freed = await asyncio.get_running_loop().run_in_executor(
                None, PartialStore(entry.path).remove_parts, entry.partial, drop)
        log.info("DIAG: partial model parts deleted %s", kv(model=entry.id, parts=len(drop),
                                                            freed_mb=round(freed / 1e6, 1),
                                                            held=entry.partial.describe()))
