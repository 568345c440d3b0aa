"""A loaded slice whose file is only TOUCHED (the same bytes, a new mtime: `touch`, identical bytes
copied back) serves on (review r34, 2026-12-07). The first slice reads its embedding rows from the
descriptor it opened and refuses them once the file's (size, mtime) move; a re-hash that found the
same bytes (a chat request's load check, the watch) vouches for the new stat, and with no such
re-hash (models_watch_s = 0) a step fails and the file is hashed again off the slice's executor. Other bytes are still refused, and
the slice is then released. Real nodes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import torch

from node.errors import ModelLoadError
from node.inference.weights.gguf_file import FileChangedWhileOpen
from node.models import hash_cache
from node.models.changed import async_refuse_changed
from tests.pipeline.test_held_file_changed import OTHER, _overwrite
from tests.pipeline.test_loaded_slice_file_changed import _embed, helped_first_slice
from tests.support.helpserve import data_with_models, quick_choice
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


@pytest.fixture
def quick(monkeypatch):
    quick_choice(monkeypatch)


def touch(path, seconds: int = 2) -> None:
    """A new mtime, the same bytes."""
    mtime = path.stat().st_mtime_ns + seconds * 10**9
    os.utime(path, ns=(mtime, mtime))


async def test_a_touch_hashed_again_before_the_watch_looks_leaves_the_first_slice_serving(tmp_path, quick):
    """Review r34, 1: the re-hash (here a load's check, as a chat request's) took the new stat, so the
    watch never saw a change; every embed failed 'written over on disk' for good, still advertised."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(models)
    async with running_node(node_config(data, models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        hosted = await helped_first_slice(node, entry.id)
        before = await _embed(hosted)
        touch(path)
        await async_refuse_changed(node.catalog, entry)  # hashes again: the same bytes
        assert not entry.changed and entry.hashed_stat == (path.stat().st_size, path.stat().st_mtime_ns)
        for _ in range(2):
            await node.model_files.watcher.async_look()
        assert torch.equal(await _embed(hosted), before)  # (FileChangedWhileOpen)
        assert hosted.state == "loaded" and entry.sha256 in {a["sha256"] for a in node.slice_host.adverts()}
        assert node.catalog.entries.get(entry.id) is entry


async def test_with_no_watch_a_touch_fails_a_step_at_once_and_is_hashed_off_the_slices_executor(
        tmp_path, quick, monkeypatch):
    """Review r36, 1: with models_watch_s = 0 the first step after a touch hashed the whole file on the
    slice's own executor, every other session's step (and CANCEL, SESSION_END) waiting behind it past
    its deadline, the slice still advertised. Now the step fails at once (its coordinator fails over),
    the slice is not advertised while the file is hashed in another executor, then reads on. Other
    bytes written in place: refused, no longer advertised, and freed."""
    holding, gate = threading.Event(), threading.Event()
    real = hash_cache.sha256_file

    def held_hash(*args, **kwargs):
        if holding.is_set():
            gate.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(hash_cache, "sha256_file", held_hash)
    data, models = data_with_models(tmp_path)
    path = tiny_model(models)
    async with running_node(node_config(data, models_watch_s=0.0, serve_reevaluate_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        hosted = await helped_first_slice(node, entry.id)
        before = await _embed(hosted)
        holding.set()
        try:
            touch(path)
            step = asyncio.ensure_future(_embed(hosted))
            await wait_until(step.done, 20.0, what="the step to fail at once, not after the file's hash")
            with pytest.raises(FileChangedWhileOpen):
                await step
            await wait_until(lambda: hosted.checking, 20.0, what="the file to be hashed again")
            assert entry.sha256 not in {a["sha256"] for a in node.slice_host.adverts()}
            other = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: "free")
            assert await wait_until(other.done, 20.0, what="the slice's executor to be free while hashing")
        finally:
            holding.clear()
            gate.set()
        await wait_until(lambda: not hosted.checking and entry.sha256 in {a["sha256"] for a in node.slice_host.adverts()},
                         20.0, what="the touched slice to serve again")
        assert torch.equal(await _embed(hosted), before)
        assert not entry.changed and hosted.state == "loaded"
        await asyncio.to_thread(_overwrite, path, OTHER)
        with pytest.raises(ModelLoadError, match="on disk since it was loaded"):
            await _embed(hosted)
        await wait_until(lambda: entry.changed, 20.0, what="other bytes to be found")
        assert entry.sha256 not in {a["sha256"] for a in node.slice_host.adverts()}
        await wait_until(lambda: hosted.state == "unloaded", 20.0, what="the slice of other bytes to be freed")


async def test_a_touched_layers_slice_serves_on_through_the_watch(tmp_path):
    """Review r34, 3: the watch drained every loaded slice of a touched file, `--layers` ones too, and
    only a resume loads those again: a headless `--model PATH --layers 0-1` served nothing until a
    restart. The watch now hashes first: the same bytes, the slice serves on."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: node.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        before = await _embed(hosted)
        touch(path)
        for _ in range(3):
            await node.model_files.watcher.async_look()
        assert node.slice_host.for_model(entry.sha256) == [hosted]  # (freed, never loaded again)
        assert entry.sha256 in {a["sha256"] for a in node.slice_host.adverts()}
        assert not entry.changed and torch.equal(await _embed(hosted), before)
        await asyncio.to_thread(_overwrite, path, OTHER)  # other bytes: it still goes
        await node.model_files.watcher.async_look()
        assert entry.changed and entry.sha256 not in {a["sha256"] for a in node.slice_host.adverts()}
        await wait_until(lambda: hosted.state == "unloaded", 20.0, what="the slice of other bytes to be freed")
