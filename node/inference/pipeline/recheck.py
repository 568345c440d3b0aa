"""FileRecheck (a SliceHost part): a loaded slice whose file changed on disk since it was opened.
A step's read vouches for the file by its stat only (`_vouch_for`: hashing nothing on the slice's
executor); otherwise the step fails fast and the loop has the file hashed again off both (`_recheck`),
the slice neither advertised nor given new sessions meanwhile; the same bytes serve on, other bytes
drain it (split from host.py 2026-12-07)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from node import const
from node.inference.pipeline.hosted import HostedSlice
from node.logs import kv
from node.models.changed import touched_again, vouched

log = logging.getLogger(__name__)


class FileRecheck:
    """SliceHost's file re-check; uses its `slices`, `catalog`, `on_file_changed`, `on_change`,
    `_notes`, `drain` and `async_unload`."""

    def _vouch_for(self, hosted: HostedSlice, loop: asyncio.AbstractEventLoop) -> Callable[[Any, Any], bool]:
        """A loaded slice's GgufFile.vouch (its executor, hashing nothing): whether its file, changed
        since it was opened, was hashed at its new stat as the same bytes (node.models.changed.vouched).
        Not yet: the step fails, saying the file is being checked (its coordinator fails over), and the
        loop has the file hashed again (`_recheck`)."""
        from node.inference.weights.gguf_file import FileChangedWhileOpen

        def vouch(path, st) -> bool:
            if vouched(hosted.entry, path, st):
                return True
            loop.call_soon_threadsafe(self._recheck, hosted)
            if hosted.entry.changed:  # (other bytes, known: "written over")
                return False
            # not known yet (review r40: every step said "written over", a plain touch too)
            raise FileChangedWhileOpen(f"{path.name} changed on disk since it was loaded: "
                                       "its file is being checked again")
        return vouch

    def _recheck(self, hosted: HostedSlice) -> None:
        """A loaded (or draining) slice's file changed since it was hashed: not advertised nor given new sessions
        while it is hashed again (on_file_changed: Contributions.async_release_changed, in an executor;
        other bytes drain its slices), then served on (2026-12-07, review r36: the slice hashed it on its
        own executor, every session's step stalled behind it, and stayed advertised)."""
        if hosted.checking or hosted.state not in ("loaded", "draining") or self.on_file_changed is None:
            return  # (a draining one too: review r40, its remaining sessions failed every step till freed)
        hosted.checking = True
        if hosted.state == "loaded" and self.on_change is not None:
            self.on_change()
        task = asyncio.get_running_loop().create_task(self._async_recheck(hosted), name="slice-file-changed")
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def _async_recheck(self, hosted: HostedSlice) -> None:
        entry, loop = hosted.entry, asyncio.get_running_loop()
        try:
            for _ in range(const.SLICE_RECHECK_TOUCHED_TRIES):
                if hosted.state == "draining" and self.catalog is not None and not any(
                        s.entry is entry and s.state == "loaded" for s in self.slices.values()):
                    # (async_release_changed hashes for loaded slices only) other bytes: marked changed, and the
                    # slice is freed as it was to be
                    same = not entry.changed and await loop.run_in_executor(None, self.catalog.same_bytes, entry)
                else:
                    same = await self.on_file_changed(entry)
                if not same or hosted.state not in ("loaded", "draining"):
                    return
                reads = await loop.run_in_executor(None, _reads_on, hosted)
                if reads:
                    return
                if reads is False:  # the same bytes at the path, but not in the file it opened
                    log.warning("DIAG: loaded slice's open file is not the one hashed, the slice is freed %s", kv(
                        model=entry.id, layers=f"{hosted.start}-{hosted.end - 1}"))
                    hosted.drained_changed = True
                    self.drain(hosted)
                    await self.async_unload(hosted)
                    return
                log.info("DIAG: slice's file touched again while it was hashed, hashing it again %s", kv(
                    model=entry.id, layers=f"{hosted.start}-{hosted.end - 1}"))
            # (touched at every re-hash: it serves on, and its next step has it checked again)
        finally:
            hosted.checking = False
            if hosted.state == "loaded" and self.on_change is not None:
                self.on_change()


def _reads_on(hosted: HostedSlice) -> bool | None:
    """Whether a loaded slice's open file reads as the bytes it was loaded from (a stat; blocking); None:
    not yet, the file at the path was touched again since it was hashed (`touched_again`: hash it again)."""
    from node.inference.weights.gguf_file import FileChangedWhileOpen

    model = hosted.model
    try:
        if model is not None:  # (unloaded meanwhile: nothing reads it)
            model.file.check_unchanged()
    except FileChangedWhileOpen:
        return None if touched_again(hosted.entry, model.file.opened_stat()) else False
    return True
