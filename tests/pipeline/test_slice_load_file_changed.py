"""A slice's file touched or replaced while the slice loads (review r36, 2026-12-07). A touch (the
same bytes) failed the load ("written over on disk", untrue), and a `--layers` slice, never loaded
again, served nothing until a restart: it is hashed again off the loop and loaded again. A file
replaced by a rename between the host's check and the open was loaded, and its parts cached, under
the old sha256: the open refuses a file not at the stat it was hashed at. Real nodes on 127.0.0.1."""

from __future__ import annotations

import os
import threading

import pytest

from node.inference.arch.block import Block
from node.inference.pipeline.host import SliceHost
from node.inference.synth import write_gguf
from tests.pipeline.test_held_file_changed import OTHER
from tests.support.helpserve import data_with_models
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


def _settled(node):
    return [s for s in node.slice_host.slices.values() if s.state in ("loaded", "failed")]


async def test_a_touch_while_a_layers_slice_converts_loads_it_all_the_same(tmp_path, monkeypatch):
    data, _models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    build, once = Block.build, threading.Lock()

    def build_then_touch(*args, **kwargs):
        built = build(*args, **kwargs)
        if once.acquire(blocking=False):  # the first layer converted: the file touched
            mtime = path.stat().st_mtime_ns + 2 * 10**9
            os.utime(path, ns=(mtime, mtime))
        return built

    monkeypatch.setattr(Block, "build", build_then_touch)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: _settled(node), 30.0, what="the --layers slice to load or fail")
        assert once.locked()  # (touched as it loaded)
        assert hosted.state == "loaded", hosted.error  # (failed: "written over on disk")
        assert not entry.changed and entry.sha256 in {a["sha256"] for a in node.slice_host.adverts()}


async def test_a_file_replaced_between_the_check_and_the_open_is_refused_not_loaded(tmp_path, monkeypatch):
    data, _models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    place, once = SliceHost._place, threading.Lock()

    def place_then_replace(self, *args):
        if once.acquire(blocking=False):  # after the host's check: another file renamed over it
            other = write_gguf(path.with_name("other.tmp"), OTHER)
            mtime = path.stat().st_mtime_ns + 2 * 10**9
            os.utime(other, ns=(mtime, mtime))
            os.replace(other, path)
        return place(self, *args)

    monkeypatch.setattr(SliceHost, "_place", place_then_replace)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: _settled(node), 30.0, what="the --layers slice to load or fail")
        assert hosted.state == "failed" and hosted.refused_changed, hosted.state  # (loaded the other bytes)
        assert entry.changed and not node.slice_host.adverts()
        assert not list(node.slice_host.weight_cache.root.rglob("*.swc"))  # (the other bytes' parts, as ours)
