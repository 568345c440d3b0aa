"""A loaded slice whose file was touched is hashed again ("checking") off its executor (review r36);
review r40 (2026-12-07) on that path: peers hear it stop and start serving, a mount that numbers no
inodes does not free it, the messages say what is known, a draining slice is checked too, and the
app and the node's own planner see `checking`. Real nodes on 127.0.0.1."""

from __future__ import annotations

import os
import threading

import aiohttp
import pytest
import torch

from app.ui.models_model import MODEL_COLUMNS
from node import const
from node.errors import ModelLoadError
from node.inference.arch.block import Block
from node.models import changed, hash_cache
from tests.pipeline.test_loaded_slice_file_changed import _embed
from tests.support.helpserve import data_with_models
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


def touch(path, seconds: int = 2) -> None:
    """A new mtime, the same bytes."""
    mtime = path.stat().st_mtime_ns + seconds * 10**9
    os.utime(path, ns=(mtime, mtime))


class HeldHash:
    """hash_cache.sha256_file held (while `holding`) until released: the re-hash's window."""

    def __init__(self, monkeypatch):
        self.holding, self.gate, self.entered = threading.Event(), threading.Event(), threading.Event()
        real = hash_cache.sha256_file

        def held(*args, **kwargs):
            if self.holding.is_set():
                self.entered.set()  # (its stat was read: a touch from now on is after it)
                self.gate.wait(60)
            return real(*args, **kwargs)
        monkeypatch.setattr(hash_cache, "sha256_file", held)

    def hold(self) -> None:
        self.entered.clear()
        self.gate.clear()
        self.holding.set()

    def release(self) -> None:
        self.holding.clear()
        self.gate.set()


def seen_by(peer, node, sha256: str) -> bool:
    """`peer` holds, from `node`'s last HELLO, a served (not loading) slice advert of the model."""
    return any(s.node_id == node.node_id and any(m.get("sha256") == sha256 and "start" in m and not m.get("loading")
                                                 for m in s.models)
               for s in peer.peers.peers())


async def _step_fails(hosted) -> None:
    try:
        await _embed(hosted)
    except Exception:  # noqa: BLE001 - the step of a touched file fails (FileChangedWhileOpen)
        return
    raise AssertionError("a step read a touched file before it was hashed again")


async def test_peers_hear_a_slice_stop_and_start_serving_while_its_file_is_checked(tmp_path, monkeypatch):
    """Review r40, 1: SliceHost.on_change was never wired, so no HELLO said the slice was being
    checked (peers routed chains into refusals) nor that it served again: a HELLO sent meanwhile went
    out without it and peers dropped this node's layers until some unrelated announce."""
    held = HeldHash(monkeypatch)
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        boot = [f"127.0.0.1:{a.peers.listen_port}"]
        async with running_node(node_config(tmp_path / "b", bootstrap=boot)) as b:
            await wait_until(lambda: seen_by(b, a, entry.sha256), 20.0, what="b to see a's slice")
            held.hold()
            try:
                touch(path)
                await _step_fails(hosted)
                await wait_until(lambda: hosted.checking, 20.0, what="the file to be hashed again")
                await wait_until(lambda: not seen_by(b, a, entry.sha256), 20.0,
                                 what="b to hear that a's slice is not served while it is checked")
                await a.peers.async_announce()  # (a HELLO meanwhile: without the slice)
            finally:
                held.release()
            await wait_until(lambda: not hosted.checking and hosted.state == "loaded", 20.0, what="the check to end")
            await wait_until(lambda: seen_by(b, a, entry.sha256), 20.0, what="b to hear a's slice serves again")
            await _embed(hosted)


def _numbered(st: os.stat_result, ino: int) -> os.stat_result:
    fields = list(st[:10])
    fields[1] = ino
    return os.stat_result(fields)


async def test_a_touch_on_a_mount_without_inode_numbers_does_not_free_the_slice(tmp_path, monkeypatch):
    """Review r40, 2: where st_ino is 0 (some FUSE and network mounts) `vouched` never vouched, so the
    re-hash found the same bytes and then freed the slice as if its open file were another: a
    `--layers` slice was never loaded again. Now the stat alone is checked there."""
    real = changed.same_file
    monkeypatch.setattr(changed, "same_file", lambda a, b: real(_numbered(a, 0), _numbered(b, 0)))
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        before = await _embed(hosted)
        touch(path)
        await _step_fails(hosted)  # (not hashed at this stat yet)
        await wait_until(lambda: entry.hashed_stat == (path.stat().st_size, path.stat().st_mtime_ns)
                         and not hosted.checking, 20.0, what="the touched file to be hashed again")
        assert hosted.state == "loaded" and not hosted.drained_changed
        assert torch.equal(await _embed(hosted), before)
        assert entry.sha256 in {a["sha256"] for a in a.slice_host.adverts()}


async def test_a_step_after_a_touch_says_the_file_is_checked_not_written_over(tmp_path):
    """Review r40, 3: every step refused after a plain touch said the file 'was written over ... its
    bytes are no longer this model's' (a user saw it in a 503), before anything was known."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        touch(path)
        with pytest.raises(ModelLoadError) as refused:
            await _embed(hosted)
        assert "being checked again" in refused.value.message and "written over" not in refused.value.message


async def test_a_layers_slice_touched_at_every_load_fails_saying_so_and_loads_later(tmp_path, monkeypatch):
    """Review r40, 3: a sync tool re-stamping the file during each of the SLICE_LOAD_TOUCHED_TRIES loads
    failed the slice 'written over on disk' (untrue: the same bytes), and a `--layers` slice stayed
    failed until a restart. Now it says it was touched, and is loaded again later."""
    monkeypatch.setattr(const, "PARTIAL_OPEN_RETRY_MIN_S", 0.2)
    data, _models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    build, touching = Block.build, threading.Event()
    touching.set()

    def build_then_touch(*args, **kwargs):
        built = build(*args, **kwargs)
        if touching.is_set():
            touch(path)
        return built

    monkeypatch.setattr(Block, "build", build_then_touch)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=3600.0)) as a:
        entry = a.catalog.resolve("tiny")
        failed = await wait_until(lambda: next((s for s in a.slice_host.slices.values() if s.state == "failed"), None),
                                  30.0, what="the slice touched at every load to fail")
        assert "touched" in failed.error and "written over" not in failed.error, failed.error
        assert not failed.refused_changed and not entry.changed
        touching.clear()
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 30.0,
                                    what="the slice to be loaded again later")
        assert entry.sha256 in {a["sha256"] for a in a.slice_host.adverts()}
        await _embed(hosted)


async def test_a_draining_slice_whose_file_is_touched_is_checked_and_reads_on(tmp_path):
    """Review r40, 4: `_recheck` looked at loaded slices only, so with models_watch_s = 0 every step
    of a draining slice's remaining sessions failed after a touch until the slice was freed."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        before = await _embed(hosted)
        a.slice_host.drain(hosted)  # (a move left it: its sessions finish on it)
        touch(path)
        await _step_fails(hosted)
        await wait_until(lambda: entry.hashed_stat == (path.stat().st_size, path.stat().st_mtime_ns)
                         and not hosted.checking, 10.0, what="the draining slice's touched file to be hashed again")
        assert hosted.state == "draining" and not entry.changed
        assert torch.equal(await _embed(hosted), before)


async def test_a_checked_slice_is_shown_so_and_not_planned_on_by_its_own_node(tmp_path, monkeypatch):
    """Review r40, 5: while its file was hashed again the slice's row said just `loaded` (admin API, the
    app's Models tab), and the node's own planner still routed its requests into it (one attempt
    each, refused)."""
    held = HeldHash(monkeypatch)
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a, \
            aiohttp.ClientSession() as s:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        assert [h.node_id for h in a.pipeline.holders.holders(entry.sha256)] == [a.node_id]

        async def row() -> dict:
            async with s.get(f"http://127.0.0.1:{a.api.port}/api/admin/models",
                             headers={"Authorization": f"Bearer {a.api_key}"}) as r:
                assert r.status == 200
                return next(m for m in (await r.json())["models"] if m["sha256"] == entry.sha256)
        state = next(c for c in MODEL_COLUMNS if c.title == "State")
        assert state.text(await row()) == "loaded"
        held.hold()
        try:
            touch(path)
            await _step_fails(hosted)
            await wait_until(lambda: hosted.checking, 20.0, what="the file to be hashed again")
            shown = await row()
            assert shown["checking"] and "checking" in state.text(shown) and state.tooltip(shown)
            assert a.pipeline.holders.holders(entry.sha256) == []
        finally:
            held.release()
        await wait_until(lambda: not hosted.checking, 20.0, what="the check to end")
        assert state.text(await row()) == "loaded"
        assert [h.node_id for h in a.pipeline.holders.holders(entry.sha256)] == [a.node_id]


async def test_a_second_touch_while_the_file_is_hashed_again_does_not_free_the_slice(tmp_path, monkeypatch):
    """Review r41, 2: the re-hash records the stat it read before hashing, so a second touch meanwhile (a
    sync tool) left the open file's stat unvouched: the slice was freed as if its open file were another
    ("open file is not the one hashed"), and a `--layers` slice never loaded again. Now it is hashed again."""
    held = HeldHash(monkeypatch)
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        before = await _embed(hosted)
        held.hold()
        try:
            touch(path)
            await _step_fails(hosted)
            await wait_until(held.entered.is_set, 20.0, what="the touched file's re-hash to start")
            touch(path, 4)
        finally:
            held.release()
        await wait_until(lambda: not hosted.checking, 20.0, what="the file touched again to be hashed again")
        assert hosted.state == "loaded" and not hosted.drained_changed and not entry.changed
        assert entry.hashed_stat == (path.stat().st_size, path.stat().st_mtime_ns)
        assert torch.equal(await _embed(hosted), before)
        assert entry.sha256 in {a["sha256"] for a in a.slice_host.adverts()}


async def test_a_slice_renamed_over_with_the_same_bytes_is_still_freed(tmp_path):
    """Review r41, 2: what is freed: a slice whose open file is no longer the one at the path (another file
    of the same bytes renamed over it after a touch) reads bytes nothing vouches for."""
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        copy = path.with_name("copy.gguf.tmp")
        copy.write_bytes(path.read_bytes())
        touch(path)
        os.replace(copy, path)
        await _step_fails(hosted)
        await wait_until(lambda: hosted.state == "unloaded", 20.0, what="the slice to be freed")
        assert hosted.drained_changed and not entry.changed


async def test_a_check_cancelled_by_the_stop_starts_no_announcement(tmp_path, monkeypatch):
    """Review r41, 3: the stop cancels the announce task ("background"), then the slices' checks ("slices"):
    a cancelled check's end said the slice serves again (on_change), which started a new announce task
    on the stopping node, left running past its stop."""
    held = HeldHash(monkeypatch)
    data, models = data_with_models(tmp_path)
    path = tiny_model(tmp_path)
    async with running_node(node_config(data, path, layers="0-1", models_watch_s=0.0)) as a:
        entry = a.catalog.resolve("tiny")
        [hosted] = await wait_until(lambda: a.slice_host.for_model(entry.sha256), 20.0, what="the --layers slice")
        held.hold()
        try:
            touch(path)
            await _step_fails(hosted)
            await wait_until(held.entered.is_set, 20.0, what="the touched file's re-hash to start")
            await wait_until(lambda: a._announce_task is None or a._announce_task.done(), 20.0,
                             what="the announcement of the check to be sent")
            before = a._announce_task
            await a.stop()
            await wait_until(lambda: not a.slice_host._notes, 20.0, what="the cancelled check to end")
        finally:
            held.release()
        assert not hosted.checking and hosted.state == "loaded"
        assert a._announce_task is before, "an announce task was started on the stopping node"
