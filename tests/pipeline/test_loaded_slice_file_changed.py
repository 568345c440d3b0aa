"""A LOADED slice whose file changes on disk (review r32, 2026-12-07). The slice's layer weights are
copies made at the load, but a first slice's embedding rows were read from the file by path on
every request: written over in place (`cp`) or replaced (a re-download's rename), they came from
the new bytes, mixed with the old layers (silently wrong text), and the slice stayed advertised under
the old sha256 while the model never left (its drop waited for the slice). Now the rows come from
the descriptor opened at the load (a replaced or deleted file keeps its bytes; one written over in
place is refused), and the watch's finding drains the slice, so the model leaves and the new bytes
are read as a new model. Real nodes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
import torch

from node.errors import ModelLoadError
from node.inference.synth import write_gguf
from tests.pipeline.test_held_file_changed import OTHER, _overwrite
from tests.support.helpserve import data_with_models, quick_choice
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio

IDS = torch.tensor([1, 5, 42, 511])


async def _embed(hosted, ids=IDS) -> torch.Tensor:
    """The slice's embedding of `ids`, on its executor (as a chain's first step reads them)."""
    return await asyncio.get_running_loop().run_in_executor(hosted.executor, hosted.model.embed, ids)


async def _look_until(node, condition, what: str):
    """The models folder's watch looks (its own timer is off here) until `condition()` holds."""
    async def looked():
        await node.model_files.watcher.async_look()
        return condition()
    for _ in range(20):
        if await looked():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def quick(monkeypatch):
    quick_choice(monkeypatch)


async def helped_first_slice(node, model_id: str):
    """Help serve `model_id` (the whole model loaded at start is unloaded first: a loaded model's file
    is not dropped): its slice holding layer 0, once loaded."""
    entry = node.catalog.resolve(model_id)
    await node.models.async_unload(entry.id)
    await node.contributions.async_help(entry.id, 0)
    return await wait_until(lambda: next((h for h in node.slice_host.for_model(entry.sha256)
                                          if h.start == 0 and h.entry is entry), None), 20.0,
                            what="the Help-serve slice to load")


@pytest.mark.parametrize("how", ["in_place", "replaced"])
async def test_a_loaded_first_slice_keeps_its_bytes_then_drains_and_the_new_file_is_a_new_model(tmp_path, quick, how):
    data, models = data_with_models(tmp_path)
    path = tiny_model(models)
    async with running_node(node_config(data, models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        hosted = await helped_first_slice(node, entry.id)
        before = await _embed(hosted)
        if how == "in_place":  # `cp other.gguf models/tiny.gguf`: the same inode, other bytes
            new_sha = await asyncio.to_thread(_overwrite, path, OTHER)
            with pytest.raises(ModelLoadError, match="on disk since it was loaded"):
                await _embed(hosted)  # (it returned the new file's rows)
        else:  # a re-download renamed over it: the slice's open file keeps the old bytes
            new = write_gguf(tmp_path / "other.gguf", OTHER)
            new_sha = hashlib.sha256(new.read_bytes()).hexdigest()
            os.replace(new, path)
            assert torch.equal(await _embed(hosted), before)  # (it returned the new file's rows)
        await node.model_files.watcher.async_look()  # the watch finds the file changed
        assert entry.sha256 not in {a["sha256"] for a in node.slice_host.adverts(loading=True)}
        assert node.slice_host.containing(entry.sha256, 0, hosted.end) is None  # no new session on it
        await wait_until(lambda: hosted.state == "unloaded", 20.0, what="the slice to be freed (no session ran)")
        await _look_until(node, lambda: entry.id not in node.catalog.entries and node.catalog.by_sha(new_sha),
                          "the old model to leave and the new bytes to be read as a new model")


async def test_deleting_a_helped_file_with_a_copy_left_goes_on_from_the_copy_with_the_loaded_slice(tmp_path, quick):
    """Review r32, 2: the Help-serve file deleted while its slice was loaded, an identical copy in the
    folder. The drop waited for the slice, so the choice stayed on the deleted file for good (both
    rows shown serving) and every chain through layer 0 failed (FileNotFoundError). Now the model
    leaves, the choice goes on from the copy, and the slice serves on the same bytes."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(models)
    copy = models / "tiny-copy.gguf"
    copy.write_bytes(path.read_bytes())
    async with running_node(node_config(data, models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        other = next(e for e in node.catalog.entries.values() if e.path.name == copy.name)
        hosted = await helped_first_slice(node, entry.id)
        before = await _embed(hosted)
        path.unlink()
        await _look_until(node, lambda: entry.id not in node.catalog.entries, "the watch to drop the deleted file")
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.entry is other
        assert node.config.contribute_models == {other.id: 0}
        assert hosted.state == "loaded" and node.slice_host.for_model(entry.sha256) == [hosted]
        assert entry.sha256 in {a["sha256"] for a in node.slice_host.adverts()}
        assert torch.equal(await _embed(hosted), before)  # (FileNotFoundError on every request)
        [row] = node.contributions.summary()["models"]
        assert row["model"] == other.id and not row["error"] and row["serving"], row
