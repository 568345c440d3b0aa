"""A catalogued file whose bytes changed on disk since it was hashed is refused before anything
loads it: a whole model (ModelManager.async_load) and a layer slice (SliceHost.async_load) alike.
Loading it would bring other bytes up under the old id and sha256 and hand them (a whole model's
replies, a slice's hidden states) to peers as that model."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from node.errors import FileChangedOnDisk
from node.logs import kv
from node.models.catalog import ModelCatalog, ModelEntry

log = logging.getLogger(__name__)


def stat_or_none(path: Path) -> tuple[int, int] | None:
    """(size, mtime_ns) of a file; None when it is gone (blocking)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


async def async_refuse_changed(catalog: ModelCatalog, entry: ModelEntry) -> None:
    """FileChangedOnDisk (a ModelUnavailable: 503) when the entry's file no longer holds the bytes its
    id names: the watch saw it changed, or its (size, mtime_ns) now (a stat off the loop) are not those its sha256 was
    computed over, and hashing it again (off the loop, once per change: catalog.same_bytes) finds
    other bytes (a touched file loads as before; the entry is then marked `changed`). A partial
    model (its parts are checked as they arrive) and a gone file (the load says so) pass."""
    if not entry.has_file or entry.partial is not None or entry.hashed_stat is None:
        return
    loop = asyncio.get_running_loop()
    if not entry.changed and await loop.run_in_executor(None, stat_or_none, entry.path) in (None, entry.hashed_stat):
        return
    log.info("DIAG: model file changed on disk since it was hashed, hashing it again before loading %s",
             kv(model=entry.id, path=entry.path))
    if await loop.run_in_executor(None, catalog.same_bytes, entry) is not False:
        return
    then = ("it is read again as a new model, under a new id, at the models folder's next look"
            if entry.source == "data_dir" else
            "add it again (Add in the Models tab, or `swarmllm models add PATH`) to serve its new bytes as a "
            "new model; with its old bytes put back, it is served again (at once when added again)")
    log.info("DIAG: model file holds other bytes than its id names, not loaded %s", kv(model=entry.id, path=entry.path))
    raise FileChangedOnDisk(f"the file of model {entry.id} ({entry.path.name}) changed on disk since it was "
                           f"hashed, so it is no longer this model: {then}")


def same_file(a, b) -> bool | None:
    """Whether two stats are of one file: the same (device, inode); None when it cannot tell: an inode of 0
    (some FUSE and network mounts number none) is unknown, not the same (2026-12-07, review r36: two files
    were one)."""
    if a.st_ino == 0 or b.st_ino == 0:
        return None
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def vouched(entry: ModelEntry, path: Path, st) -> bool:
    """Whether a file a loaded slice opened as `entry`, its descriptor's stat `st` no longer the one
    it was opened at, was hashed at that stat as the bytes entry.sha256 names (only touched: the slice
    reads on). Hashes nothing (2026-12-07, review r36: it hashed on the slice's executor, every other
    session's step waiting behind it): the caller has the file hashed again off the loop and the
    executor (SliceHost: Contributions.async_release_changed) and the step fails meanwhile. Blocking:
    a stat, on the slice's executor."""
    if entry.partial is not None or not entry.has_file or entry.changed or path != entry.path:
        return False
    if entry.hashed_stat != (st.st_size, st.st_mtime_ns):
        return False
    return _at_path(entry, st)  # the one hashed, not replaced by a rename


def touched_again(entry: ModelEntry, st) -> bool:
    """Whether a slice's open file, found the same bytes at the path but its descriptor's stat `st` not
    vouched for, was only touched again while it was hashed: its stat is not the one hashed, and it is
    still the file at the path (or it cannot tell: no inode numbers). Then it is hashed again, not freed
    (2026-12-07, review r41: a second touch during the re-hash freed a `--layers` slice for good). False:
    another file is at the path now (renamed over), or none. Blocking: a stat."""
    if st is None or entry.partial is not None or (st.st_size, st.st_mtime_ns) == entry.hashed_stat:
        return False
    return _at_path(entry, st)


def _at_path(entry: ModelEntry, st) -> bool:
    """Whether the file of descriptor stat `st` is still the one at the entry's path (blocking: a stat);
    on a mount numbering no inodes, taken as so (review r40: a touch there freed a loaded slice for good)."""
    try:
        return same_file(entry.path.stat(), st) is not False
    except OSError:
        return False
