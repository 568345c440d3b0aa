"""Model files coming and going while a node runs: the models folder's watch (node.models.watch) and
the admin API's `POST /api/admin/models/add {"path"}` (`swarmllm models add PATH`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from node.datadir import MODELS_DIR, keep_aside
from node.errors import InvalidRequest, ModelLoadError
from node.logs import kv
from node.models.catalog import ModelEntry, check_model_file
from node.models.file_kinds import NotAModel, split_part
from node.models.watch import ModelWatcher

Node = Any  # node.node.Node (not imported: it imports this module)

log = logging.getLogger(__name__)

IN_USE_STATES = ("loaded", "loading", "unloading")


class ModelFiles:
    """Adds and removes whole-model files on a running node."""

    def __init__(self, node: Node):
        self.node = node
        self.watcher = ModelWatcher(node.data_dir / MODELS_DIR, node.catalog, interval_s=node.config.models_watch_s,
                                    add=lambda path: node.async_add_model(path, "data_dir"), drop=self.async_drop,
                                    busy=lambda: {j.file_name for j in node.downloads.all() if j.active},
                                    changed=lambda entry: node.contributions.async_release_changed(entry),
                                    noted=node.models.note_entry)

    async def async_add_path(self, raw: str, *, load: bool = False) -> tuple[dict[str, Any], bool]:
        """Serve the GGUF file at `raw` (an absolute path) for this run, as `--model PATH` does at
        start: (its model summary, whether it is new here). InvalidRequest says what is wrong with
        the file (missing, a folder, not a GGUF, truncated) before anything hashes it."""
        if "\x00" in raw:
            raise InvalidRequest("path holds a NUL character", param="path")
        path = Path(raw)
        if not path.is_absolute():
            raise InvalidRequest(f"path must be absolute (the node's working directory is not yours): {raw}",
                                 param="path")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, check_model_file, path, "api")
        except ModelLoadError as exc:
            raise InvalidRequest(exc.message, param="path") from exc
        model_id, added = await self.node.async_add_model_file(path, "api")
        if load:
            return await self.node.async_load_model(model_id), added
        return self.node.models.get(model_id).summary(), added

    async def async_add_downloaded(self, path: Path, *, sha256: str | None, origin_url: str | None) -> str:
        """A finished download served (Node.async_add_model). One the catalog refuses as damaged
        (not a GGUF it can read, truncated; not a projector or an adapter, NotAModel) is moved aside
        to NAME.broken, as damaged data-dir files are (`datadir.keep_aside`), and its error says so
        (2026-12-07: it stayed in models/ as a .gguf, refused again at every start, beside the
        served ones). A split set's part is left where it is (other downloads may own its parts)."""
        node = self.node
        try:
            return await node.async_add_model(path, "data_dir", sha256=sha256, origin_url=origin_url)
        except NotAModel:
            raise
        except ModelLoadError as exc:
            if path not in node.catalog.skipped or split_part(path) is not None:  # (not refused: the node stops)
                raise
            try:
                broken = await asyncio.get_running_loop().run_in_executor(None, keep_aside, path)
            except OSError:
                raise exc from None
            node.catalog.skipped.pop(path, None)
            log.warning("DIAG: downloaded model file cannot be served, moved aside %s",
                        kv(file=path.name, kept_as=broken.name, error=exc.message))
            raise ModelLoadError(f"{exc.message}; the downloaded file is kept aside as {MODELS_DIR}/{broken.name}, "
                                 "not served (delete it, or download the model again)") from None

    async def async_drop(self, entry: ModelEntry) -> bool:
        """Remove the model of a file that is gone (or changed), unless it is loaded or in use (False:
        asked again later) or held here as layer slices (of a changed file: its own; of a gone one:
        any, unless another file in the catalog has its bytes)."""
        node = self.node
        served = node.models.registered(entry.id)
        if served is not None and served.entry is not entry:
            return False
        if served is not None and (served.state in IN_USE_STATES or served.busy or served.waiting or served.running
                                   or served.engine is not None):
            return False
        held = [s for s in list(node.slice_host.slices.values()) if s.entry.sha256 == entry.sha256]
        if entry.changed and any(s.entry is entry for s in held):
            return False  # its slices drain first (Contributions.async_release_changed), then it leaves
        if held and not entry.changed and not any(
                e is not entry and e.sha256 == entry.sha256 and e.has_file and not e.changed and e.partial is None
                for e in list(node.catalog.entries.values())):
            # gone with no copy: its slices read on through the file they opened; it leaves once they are
            # freed. With a copy it leaves now, and the choice goes on from the copy, keeping those slices
            # (2026-12-07, review r32: it stayed, so the choice stayed on the deleted file for good)
            return False
        if not node.catalog.remove_file_entry(entry):
            return False
        if served is not None:
            node.models.forget(entry, removed=True)
        await node.contributions.async_forget(entry)  # (its layer choice retried the missing file for ever)
        node.note_activity(f"model {entry.id} removed (its file is gone)")
        if node.peers is not None:
            await node.peers.async_announce()
        return True
