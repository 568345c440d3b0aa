"""The models folder while the node runs: `.gguf` files copied in are served, removed ones leave.
(Any-case `.gguf`; a split model is its part 1, whose stat here covers the parts present: file_kinds.py.)

Every `models_watch_s` the folder is listed and its files stat'ed (in an executor; nothing is read).
A file not in the catalog is taken once two looks in a row find the same size and mtime (a copy
still being written is left alone), then scanned as at start (hashed in an executor) and registered,
not loaded. A file the scan refuses (truncated, not a GGUF), or finds to be a model served already, is looked at
again only once it changes. A
download's file is the download's to register (`busy`: the names of active downloads); `.part`
files never match `*.gguf`. A catalogued file that is gone (a whole model's, not the embedded
default's; of a split model, any part's) is handed to `drop`, which refuses while the model is loaded or in use: it is asked again
on the next look, so the model leaves once it is unloaded. A catalogued file whose size or mtime are
no longer those it was hashed at (overwritten in place) is a drop and an add: its model leaves and
the file is taken as a new one (a loaded model stays, marked `changed`: not handed out to peers;
its layer slices are no longer advertised and are freed once their sessions end, `changed`; a file
with loaded slices is hashed again first: only touched, nothing changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from node.errors import NodeError
from node.logs import kv
from node.models.catalog import ModelCatalog, ModelEntry
from node.models.file_kinds import model_files, set_files

log = logging.getLogger(__name__)

Stat = tuple[int, ...]  # (size, mtime_ns) of each file of the model (a split model's present parts)


def _look(models_dir: Path, known: dict[str, Path]) -> tuple[dict[Path, tuple[Path, Stat]], set[str], dict[str, Stat]]:
    """(models_dir's model files → (resolved path, stat), ids in `known` whose file is gone, the
    (size, mtime_ns) of the others' files now); blocking.
    A split model's stat covers its parts present, so part 2 copied in after part 1 was refused
    ("part 2 of 3 missing") is a change that makes part 1 tried again."""
    files: dict[Path, tuple[Path, Stat]] = {}
    try:
        listed = model_files(models_dir)
    except OSError:
        listed = []
    for path in listed:
        try:
            if path.is_symlink() and not path.exists():  # a link to a file not there (a drive not mounted)
                files[path] = (path, (-1, -1))  # refused with that reason; tried again once its file is there
                continue
            st = path.stat()
            if not path.is_file():
                continue
            stat: Stat = (st.st_size, st.st_mtime_ns)
            for part in set_files(path)[1:]:
                with contextlib.suppress(OSError):  # a part not there (yet)
                    pst = part.stat()
                    stat += (pst.st_size, pst.st_mtime_ns)
            files[path] = (path.resolve(), stat)
        except OSError:  # removed meanwhile, a dangling link
            continue
    gone, now = set(), {}
    for model_id, path in known.items():
        try:  # a split model is gone when any of its parts is (llama.cpp could not load it)
            if not all(part.is_file() for part in set_files(path)):
                gone.add(model_id)
                continue
            st = path.stat()
            now[model_id] = (st.st_size, st.st_mtime_ns)
        except OSError:
            gone.add(model_id)
    return files, gone, now


class ModelWatcher:
    """Looks at the models folder every `interval_s`; `add(path)` serves a new file (its model id),
    `drop(entry)` removes a gone file's model (False while it must stay: loaded, in use)."""

    def __init__(self, models_dir: Path, catalog: ModelCatalog, *, interval_s: float,
                 add: Callable[[Path], Awaitable[str]], drop: Callable[[ModelEntry], Awaitable[bool]],
                 busy: Callable[[], set[str]], changed: Callable[[ModelEntry], Awaitable[bool]] | None = None,
                 noted: Callable[[ModelEntry], None] | None = None):
        self.models_dir = models_dir
        self.catalog = catalog
        self.interval_s = interval_s
        self._add, self._drop, self._busy = add, drop, busy
        self._changed = changed  # (entry) its file changed: what is served of it from that file stops (True: only touched)
        self._pending: dict[Path, Stat] = {}  # a new file → its stat at the last look
        self._done: dict[Path, Stat] = {}  # a file taken or refused → its stat then (looked at again once changed)
        self._kept: set[str] = set()  # ids whose file is gone while the model stays (said once)
        self._noted = noted  # (entry) its file_gone mark changed: what shows its state follows
        self._stale: set[str] = set()  # ids whose file changed while the model must stay (loaded)
        self._task: asyncio.Task | None = None
        self.looks = 0  # looks completed (tests wait for them)

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="models-watch")

    async def async_stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.async_look()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the watch for the rest of the run
                log.exception("models folder watch failed; trying again later")

    async def async_look(self) -> None:
        """One look: take stable new files, drop the models of gone ones."""
        known = {e.id: e.path for e in list(self.catalog.entries.values())
                 if e.has_file and e.partial is None and e.source != "default"}
        files, gone, now = await asyncio.get_running_loop().run_in_executor(None, _look, self.models_dir, known)
        await self._async_changed(now, {resolved for resolved, _stat in files.values()})
        catalogued = {e.path for e in list(self.catalog.entries.values()) if e.has_file and e.partial is None}
        busy = {name.lower() for name in self._busy()}
        for path in [p for p in list(self._pending) + list(self._done) if p not in files]:
            self._pending.pop(path, None)
            self._done.pop(path, None)
        for refused in (self.catalog.skipped, self.catalog.ignored):
            for path in [p for p in list(refused) if p.parent == self.models_dir and p not in files]:
                refused.pop(path, None)  # a refused file removed: the banner stops naming it
        for path, (resolved, stat) in files.items():
            if (path in self.catalog.skipped or path in self.catalog.ignored) and path not in self._done:  # refused at start
                self._done[path] = stat
            if resolved in catalogued or path.name.lower() in busy or self._done.get(path) == stat:
                self._pending.pop(path, None)
                continue
            if self._pending.get(path) != stat:  # new, or still being written
                self._pending[path] = stat
                continue
            del self._pending[path]
            log.info("DIAG: model file appeared in the models folder %s", kv(file=path.name, size_mb=round(sum(stat[0::2]) / 2**20, 1)))
            try:
                model_id: str | None = await self._add(path)
            except NodeError as exc:
                log.info("DIAG: model file in the models folder not served %s", kv(file=path.name, error=exc.message))
                model_id = None
            self._done[path] = stat  # (a copy of a model served from elsewhere is that model: not taken again)
            if model_id is not None:
                log.info("DIAG: model file in the models folder served %s", kv(model=model_id, file=path.name))
        for model_id in sorted(self._kept - gone):  # its file is back (restored, moved back): it can load again
            self._mark_gone(self.catalog.entries.get(model_id), False)
        self._kept &= gone | self._stale
        for model_id in sorted(gone):
            entry = self.catalog.entries.get(model_id)
            if entry is None:
                continue
            if await self._drop(entry):
                self._kept.discard(model_id)
                self._done.clear()  # a copy of it taken as that model may now be a model of its own
                log.info("DIAG: model removed, its file is gone %s", kv(model=model_id, path=entry.path))
            elif model_id not in self._kept:
                self._kept.add(model_id)
                # shown, not only logged (2026-12-07: the Models tab said plain "loaded", and Unload lost it for good)
                self._mark_gone(entry, True)
                log.info("DIAG: model file gone while the model is loaded; it leaves once unloaded %s",
                         kv(model=model_id, path=entry.path))
        self.looks += 1

    def _mark_gone(self, entry: ModelEntry | None, gone: bool) -> None:
        if entry is None or entry.file_gone == gone:
            return
        self.catalog.mark_gone(entry, gone)
        if self._noted is not None:
            self._noted(entry)

    async def _async_changed(self, now: dict[str, Stat], in_folder: set[Path]) -> None:
        """A catalogued file whose (size, mtime_ns) are not those its sha256 was computed over
        (overwritten in place: `cp other.gguf models/x.gguf`, another tool downloading it again) is a
        drop and an add: its model leaves (its id names the old bytes) and the file is taken again as
        a new one (hashed, advertised). A model that must stay (loaded, in use) is not unloaded: it is
        marked changed (not handed out to peers, not in the HELLO's `files`), said once, and dropped
        once it is unloaded; a file outside the models folder (`--model PATH`, added by path) is only
        marked and said: its owner adds it again."""
        self._stale &= set(now)
        for model_id, stat in sorted(now.items()):
            entry = self.catalog.entries.get(model_id)
            if entry is None or entry.hashed_stat is None or entry.hashed_stat == stat:
                continue
            # its loaded slices drain (2026-12-07, review r32: they served on); True: only touched, hashed
            # again as the same bytes, they serve on (review r34: a touch freed them, --layers ones for good)
            if self._changed is not None and await self._changed(entry):
                continue
            self.catalog.mark_changed(entry)
            outside = entry.path not in in_folder
            if not outside and await self._drop(entry):
                self._stale.discard(model_id)
                self._kept.discard(model_id)
                self._done.clear()  # the new bytes are a file to take again (also a copy taken as the old model)
                log.info("DIAG: model file changed on disk, the model is removed and the file read again %s",
                         kv(model=model_id, path=entry.path))
            elif model_id not in self._stale:
                self._stale.add(model_id)
                then = "add the file again (swarmllm models add) or restart to serve its new bytes" if outside else \
                    "it leaves once unloaded and the file is then read again"
                log.warning("DIAG: model file changed on disk since it was hashed; the model is not handed out to "
                            "peers, and is not unloaded %s", kv(model=model_id, path=entry.path, then=then))
