"""A slice draining because its file changed on disk, while its range is loaded again (review r34,
2026-12-07): the draining slice finishes its sessions and is freed; it is neither written over in
the host's table (its sessions lost, its memory not counted) nor revived with a file whose stat
is not the one it opened. Real nodes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os

import pytest

from node.models.changed import async_refuse_changed
from tests.pipeline.test_held_file_changed import OTHER, _overwrite
from tests.pipeline.test_loaded_slice_file_changed import _embed, helped_first_slice
from tests.support.helpserve import data_with_models, quick_choice
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


@pytest.fixture
def quick(monkeypatch):
    quick_choice(monkeypatch, drain_poll_s=0.05)


def _write_back(path, data: bytes) -> None:
    """The old bytes back in place, a new mtime."""
    mtime = path.stat().st_mtime_ns + 2 * 10**9
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(mtime, mtime))


async def _on(hosted, fn, *args):
    return await asyncio.get_running_loop().run_in_executor(hosted.executor, fn, *args)


async def _draining_with_a_session(node, path):
    """The Help-serve first slice, a session running on it, its file written over in place and the
    watch's look: draining, the session kept."""
    entry = node.catalog.resolve("tiny")
    hosted = await helped_first_slice(node, entry.id)
    await _on(hosted, hosted.model.new_session, "running")
    await asyncio.to_thread(_overwrite, path, OTHER)
    await node.model_files.watcher.async_look()
    assert hosted.state == "draining" and entry.changed
    return entry, hosted


async def test_loading_the_range_of_a_slice_draining_for_a_changed_file_keeps_it_until_freed(tmp_path, quick):
    """Review r34, 4: the new load's HostedSlice was written over the draining one in the host's
    table: its running session was no longer found (broken at its next step), and nothing freed it."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(models)
    async with running_node(node_config(data, models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        entry, hosted = await _draining_with_a_session(node, path)
        again = await node.slice_host.async_load(entry, 0, hosted.end)
        assert again is not hosted and again.state == "failed" and again.refused_changed
        assert node.slice_host.containing(entry.sha256, 0, hosted.end, sid="running") is hosted  # (None)
        assert hosted in node.slice_host.for_model(entry.sha256, draining=True)
        await _on(hosted, hosted.model.sessions.free, "running")
        await wait_until(lambda: hosted.state == "unloaded", 20.0, what="the draining slice to be freed")
        assert hosted not in node.slice_host.slices.values() and again in node.slice_host.slices.values()


async def test_a_slice_drained_for_a_changed_file_is_not_revived_once_its_bytes_are_back(tmp_path, quick):
    """Review r34, 2: the old bytes written back and hashed again cleared `changed` while the slice
    drained; a load of its range then revived it (the revive looked at `changed` alone): loaded,
    no longer freed. It is loaded again instead, and the draining one finishes and is freed."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(models)
    original = path.read_bytes()
    async with running_node(node_config(data, models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        entry, hosted = await _draining_with_a_session(node, path)
        await asyncio.to_thread(_write_back, path, original)
        await async_refuse_changed(node.catalog, entry)  # hashed again: the old bytes, `changed` cleared
        assert not entry.changed
        again = await node.slice_host.async_load(entry, 0, hosted.end)
        assert again is not hosted and again.state == "loaded"  # (the draining one revived)
        assert hosted.state == "draining"
        assert node.slice_host.containing(entry.sha256, 0, hosted.end, sid="running") is hosted
        await _on(hosted, hosted.model.sessions.free, "running")
        await wait_until(lambda: hosted.state == "unloaded", 20.0, what="the draining slice to be freed")
        assert node.slice_host.for_model(entry.sha256) == [again]
        await _embed(again)
