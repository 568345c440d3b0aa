"""A layer choice refused because its file changed on disk can be taken up again the way the app
says (review r32, 2026-12-07): with the file's old bytes put back, adding it again (Add in the
Models tab, `swarmllm models add PATH`: the file already catalogued) or helping it again with the
same budget chose nothing, and a `--serve auto` choice was never chosen again (no GUI control):
the refusal was for good, until a new budget, a pause and resume, or a restart. Now Add and the
same budget choose again at once, and the refused choice is tried again at the periodic round.
Real nodes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os

import pytest

from node import const
from node.inference.synth import write_gguf
from tests.pipeline.test_held_file_changed import _overwrite
from tests.pipeline.test_load_changed_file import MINE, MINE_NEW
from tests.support.helpserve import choice_failed, choice_loaded, loaded, quick_choice
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


@pytest.fixture
def quick(monkeypatch):
    quick_choice(monkeypatch, retry_min_s=0.05)


async def _refused(node, path):
    """Help serve the file at `path` (added by path) after it was written over: its choice fails."""
    summary, _ = await node.model_files.async_add_path(str(path))
    entry = node.catalog.entries[summary["id"]]
    old = path.read_bytes()
    await asyncio.to_thread(_overwrite, path, MINE_NEW)
    await node.contributions.async_help(entry.id, 0)
    [failure] = await choice_failed(node)
    assert "changed on disk" in failure.reason and "put back" in failure.reason, failure.reason
    return entry, old


@pytest.mark.parametrize("how", ["add_again", "help_again"])
async def test_old_bytes_put_back_then_added_or_helped_again_load_the_choice(tmp_path, quick, how):
    outside = write_gguf(tmp_path / "mine.gguf", MINE)
    # no periodic round nor watch look within the test: only the user's action chooses again
    async with running_node(node_config(tmp_path / "data", models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        entry, old = await _refused(node, outside)
        outside.write_bytes(old)  # the old bytes back (a new mtime)
        if how == "add_again":
            await node.model_files.async_add_path(str(outside))  # the file already catalogued: not new
        else:
            await node.contributions.async_help(entry.id, 0)  # the same budget
        await wait_until(lambda: choice_loaded(node, entry.sha256), 20.0, what="the choice to load the old bytes")
        assert not entry.changed and node.autoserve.failures() == []


async def test_a_serve_auto_choice_refused_as_changed_loads_once_the_old_bytes_are_back(tmp_path, monkeypatch, quick):
    """Headless `--serve auto` has no Add nor budget to set: the refused choice is tried again at the
    periodic round."""
    monkeypatch.setattr(const, "AUTO_SERVE_LOOK_S", 1.0)  # (the file is written over before the first choice)
    outside = write_gguf(tmp_path / "mine.gguf", MINE)
    old = outside.read_bytes()
    async with running_node(node_config(tmp_path / "data", outside, serve="auto", models_watch_s=3600.0,
                                        serve_reevaluate_s=1.0)) as node:
        [entry] = node.catalog.entries.values()
        await asyncio.to_thread(_overwrite, outside, MINE_NEW)
        [failure] = await choice_failed(node)
        assert "changed on disk" in failure.reason, failure.reason
        outside.write_bytes(old)
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the choice to load the old bytes")


async def test_a_touched_file_failing_to_load_for_another_reason_is_retried_soon(tmp_path, quick):
    """Review r32, 4: whether a failed load was a "changed" refusal was read from the entry's
    `changed`, which the watch sets on a touch without hashing: a load failing for another reason
    (here the file moved away for a while, a drive unmounted) counted as "changed" and waited for
    the periodic round (before that fix: for ever). It is the host's refusal that counts."""
    outside = write_gguf(tmp_path / "mine.gguf", MINE)
    async with running_node(node_config(tmp_path / "data", models_watch_s=3600.0, serve_reevaluate_s=3600.0)) as node:
        summary, _ = await node.model_files.async_add_path(str(outside))
        entry = node.catalog.entries[summary["id"]]
        await node.contributions.async_help(entry.id, 0)  # (loads: its layers are sized from the file)
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the choice to load")
        await node.contributions.async_set_paused(True)  # (a touch with a slice loaded is hashed: review r34)
        await wait_until(lambda: not node.slice_host.for_model(entry.sha256, draining=True), 20.0,
                         what="the slice to be freed")
        st = outside.stat()
        os.utime(outside, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # `touch`: the same bytes
        await node.model_files.watcher.async_look()  # (marked changed on the stat alone)
        assert entry.changed
        away = outside.rename(tmp_path / "mine.away")
        await node.contributions.async_set_paused(False)  # chosen again, the file not there
        [failure] = await choice_failed(node)
        assert "changed on disk" not in failure.reason, failure.reason
        assert failure.retry_at - failure.at < 60, failure
        away.rename(outside)  # back: a retry soon loads it
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the choice to load once the file is back")
