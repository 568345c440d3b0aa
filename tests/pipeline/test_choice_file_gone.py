"""A "Help serve" model whose file was deleted (2026-12-07, review r27): the folder's watch dropped
it from the catalog, but its layer choice went on retrying the missing file for ever, its failure
shown everywhere (state error, the banner, diagnostics, /api/admin/contribute), and unticking
"Help serve" did not stop it (async_stop looked the model up in the catalog, which had forgotten
it). The choice now ends when the catalog drops the model, or when helping it stops, by the
sha256 chosen; the choice kept in config.toml is taken up again when the file is back."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from node import const
from node.inference.synth import SynthSpec, write_gguf
from tests.support.helpserve import choice_failed, data_with_models, loaded, quick_choice
from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


def wrong_layer_count(path):
    """A GGUF whose header claims one more layer than it has tensors for: catalogued (the header
    reads fine), its slice fails on the missing layer (as tests/app/test_slice_load_failed.py's)."""
    write_gguf(path, SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256,
                               name="wrongcount"))
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.block_count") + len(b"llama.block_count")
    data[at + 4:at + 8] = (3).to_bytes(4, "little")  # after the value type (u32)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def quick(monkeypatch):
    quick_choice(monkeypatch, retry_min_s=0.2)


async def test_stopping_help_for_a_model_the_catalog_forgot_ends_its_choice(tmp_path, quick):
    data, models = data_with_models(tmp_path)
    path = wrong_layer_count(models / "wrongcount.gguf")
    async with running_node(node_config(data, models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("wrongcount")
        await node.contributions.async_help(entry.id, 0)
        await choice_failed(node)
        path.unlink()
        node.catalog.remove_file_entry(entry)  # (the folder's watch does this; its own drop: the next test)
        await node.contributions.async_stop(entry.id)
        assert node.autoserve.model(entry.sha256) is None
        assert node.autoserve.failures() == [] and node.contributions.summary() == {
            "paused": False, "models": [], "failures": []}


async def test_a_help_serve_models_deleted_file_ends_its_choice_until_the_file_is_back(tmp_path, quick):
    data, models = data_with_models(tmp_path)
    path = wrong_layer_count(models / "wrongcount.gguf")
    kept = path.read_bytes()
    async with running_node(node_config(data, models_watch_s=0.2)) as node:
        entry = node.catalog.resolve("wrongcount")
        await node.contributions.async_help(entry.id, 0)
        await choice_failed(node)
        path.unlink()
        await wait_until(lambda: entry.id not in node.catalog.entries, 20.0, what="the watch to drop the model")
        await wait_until(lambda: node.autoserve.model(entry.sha256) is None and not node.autoserve.failures(), 10.0,
                         what="the choice of the deleted model to end")
        [row] = node.contributions.summary()["models"]
        assert row["error"] == "the model is not on this machine now" and row["last_failure"] is None, row
        path.write_bytes(kept)  # the file is back: the "Help serve" kept in config.toml is taken up again
        await wait_until(lambda: node.autoserve.model(entry.sha256) is not None, 20.0,
                         what="the choice to take the model up again")


# --- review r29 ---

@pytest.mark.parametrize("late", [False, True])
async def test_a_serve_auto_models_file_gone_for_a_while_is_chosen_again_once_back(tmp_path, monkeypatch, quick, late):
    """`--serve auto` of a file outside the models folder (a network drive that dropped): the watch
    dropped it and its choice ended, and nothing took it up again (its choice is not a "Help serve"
    kept in config.toml): the node served nothing of it until restarted. It is chosen on, retrying.
    `late`: as a `--model URL` whose origin answered after the start (not at_start, but given on the
    command line: review r42, its choice ended)."""
    monkeypatch.setattr(const, "AUTO_SERVE_LOOK_S", 1.0)  # (the file goes before the first choice loads)
    nas = tmp_path / "nas"
    nas.mkdir()
    path = tiny_model(nas)
    kept = path.read_bytes()
    async with running_node(node_config(tmp_path / "data", path, serve="auto", models_watch_s=0.2,
                                        serve_reevaluate_s=1.0)) as node:
        entry = node.catalog.resolve("tiny")
        [m] = node.autoserve.models
        await wait_until(lambda: m.budget is not None, 20.0, what="the model's budget")
        if late:
            m.at_start = False  # (opened after the start, as url_models adds it: given=True)
        path.unlink()
        await wait_until(lambda: f"model {entry.id} removed (its file is gone)" in " ".join(node.activity), 20.0,
                         what="the watch to drop the model")
        assert node.autoserve.model(entry.sha256) is m
        path.write_bytes(kept)  # the drive is back
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the model's layers to load once its file is back")


async def test_a_serve_auto_models_file_gone_goes_on_from_a_copy_in_the_models_folder(tmp_path, monkeypatch, quick):
    """The same with an identical copy in the models folder: it went on retrying the missing path
    (the `--serve auto` exemption came before the look for a copy, review r30); it serves the copy."""
    monkeypatch.setattr(const, "AUTO_SERVE_LOOK_S", 1.0)
    nas = tmp_path / "nas"
    nas.mkdir()
    path = tiny_model(nas)
    data, models = data_with_models(tmp_path)
    copy = models / "tiny-copy.gguf"
    copy.write_bytes(path.read_bytes())
    async with running_node(node_config(data, path, serve="auto", models_watch_s=0.2,
                                        serve_reevaluate_s=1.0)) as node:
        entry = next(e for e in node.catalog.entries.values() if e.path == path)
        other = next(e for e in node.catalog.entries.values() if e.path.name == copy.name)
        [m] = node.autoserve.models
        await wait_until(lambda: m.budget is not None, 20.0, what="the model's budget")
        path.unlink()
        await wait_until(lambda: m.entry is other, 20.0, what="the choice to go on from the copy")
        await wait_until(lambda: loaded(node, entry.sha256), 20.0, what="the copy's layers to load")


def copies(models):
    """wrongcount.gguf and an identical wrongcount-copy.gguf: two catalog entries, one sha256."""
    path = wrong_layer_count(models / "wrongcount.gguf")
    copy = models / "wrongcount-copy.gguf"
    copy.write_bytes(path.read_bytes())
    return path, copy


async def test_deleting_a_copy_of_a_help_serve_model_leaves_the_originals_choice(tmp_path, quick):
    """The layer choice keys models by sha256: deleting an identical copy under another name ended
    the choice of the original the user helps serve (shown helped, nothing served, no error)."""
    data, models = data_with_models(tmp_path)
    path, copy = copies(models)
    async with running_node(node_config(data, models_watch_s=0.2)) as node:
        entry = node.catalog.resolve("wrongcount")
        copy_id = next(e.id for e in node.catalog.entries.values() if e.path.name == copy.name)
        await node.contributions.async_help(entry.id, 0)
        await choice_failed(node)
        copy.unlink()
        await wait_until(lambda: f"model {copy_id} removed (its file is gone)" in " ".join(node.activity), 20.0,
                         what="the watch to drop the copy")
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.entry is entry


async def test_deleting_the_help_serve_models_file_with_a_copy_left_chooses_on_from_the_copy(tmp_path, quick):
    data, models = data_with_models(tmp_path)
    path, copy = copies(models)
    async with running_node(node_config(data, models_watch_s=0.2)) as node:
        entry = node.catalog.resolve("wrongcount")
        other = next(e for e in node.catalog.entries.values() if e.path.name == copy.name)
        await node.contributions.async_help(entry.id, 0)
        await choice_failed(node)
        path.unlink()
        await wait_until(lambda: f"model {entry.id} removed (its file is gone)" in " ".join(node.activity), 20.0,
                         what="the watch to drop the original")
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.entry is other  # (it retried the deleted file for ever)
        # the choice is kept under the copy's id (review r30: the summary, so the Swarm tab and the
        # admin API, said "the model is not on this machine now" under the deleted file's id, while
        # the copy served it; the GUI's picker showed the copy as not helped, and could not untick it)
        assert node.config.contribute_models == {other.id: 0}
        [row] = node.contributions.summary()["models"]
        assert row["model"] == other.id and not row.get("error"), row
        await node.contributions.async_stop(other.id)  # unticking the copy ends it
        assert node.autoserve.model(entry.sha256) is None and node.contributions.summary()["models"] == []


async def test_adding_or_dropping_a_file_with_no_choice_does_not_wait_for_the_help_serve_controls(tmp_path):
    """Every model file added or dropped waited for the Help-serve controls' lock (review r30), which
    a Help serve holds through a partial model's origin probe and a resume through its layer fetch:
    minutes in which Add hung, a finished download was not registered and the folder's watch stalled."""
    data, models = data_with_models(tmp_path)
    gone = tiny_model(models)
    (tmp_path / "elsewhere").mkdir()
    other = tiny_model(tmp_path / "elsewhere", dataclasses.replace(TINY, name="other"), name="other.gguf")
    async with running_node(node_config(data, models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("tiny")
        await node.models.async_unload(entry.id)  # (a loaded model's file is not dropped)
        gone.unlink()
        async with node.contributions._lock:  # a long control under way
            assert await asyncio.wait_for(node.model_files.async_drop(entry), 10.0)
            added = await asyncio.wait_for(node.async_add_model(other, "cli"), 10.0)
        assert added is not None


async def test_stopping_help_while_the_file_comes_back_is_not_undone(tmp_path, quick):
    """async_file_back read the budget kept and whether the model was chosen before waiting for the
    lock: an untick queued ahead of it was undone (the model served on, and could not be unticked:
    "not helping serve"), and a new budget queued ahead was reverted."""
    data, models = data_with_models(tmp_path)
    path = wrong_layer_count(models / "wrongcount.gguf")
    async with running_node(node_config(data, models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("wrongcount")
        await node.contributions.async_help(entry.id, 0)
        await choice_failed(node)
        moved = path.with_suffix(".away")
        path.rename(moved)
        assert await node.model_files.async_drop(entry)  # (the folder's watch does this)
        assert node.autoserve.model(entry.sha256) is None
        moved.rename(path)
        lock = node.contributions._lock
        async with lock:  # another control holds the lock: the untick waits, then the file comes back
            stop = asyncio.ensure_future(node.contributions.async_stop(entry.id))
            back = asyncio.ensure_future(node.async_add_model(path, "data_dir"))
            await wait_until(lambda: len(lock._waiters or ()) == 2 or back.done(), 20.0,
                             what="the untick and the file's return to wait for the lock")
        await asyncio.gather(stop, back)
        assert entry.id not in node.config.contribute_models
        assert node.autoserve.model(entry.sha256) is None
        assert node.contributions.summary()["models"] == []


@pytest.mark.parametrize("ticks", [("copy", "original"), ("original", "copy"), ("original", "copy", "original")],
                         ids="-then-".join)
async def test_an_original_and_its_copy_both_helped_go_on_from_the_copy_at_its_budget(tmp_path, quick, ticks):
    """Both files ticked "Help serve", each with its own budget: one layer choice serves their bytes,
    at the budget set last. The original's file deleted, the choice goes on from the copy at the
    copy's budget, and the original's row stays in config.toml (taken up when the file is back, as a
    lone row's is): it ran on at the deleted original's budget, the copy's row showing another one
    until a restart changed it, and the original's row was dropped or kept by the order of the ticks.
    Unticking the original's row then leaves the copy's choice (it ended the choice of both)."""
    data, models = data_with_models(tmp_path)
    path, copy = copies(models)
    async with running_node(node_config(data, models_watch_s=0.2)) as node:
        entry = node.catalog.resolve("wrongcount")
        other = next(e for e in node.catalog.entries.values() if e.path.name == copy.name)
        budgets = {"original": (entry.id, 100), "copy": (other.id, 300)}
        for tick in ticks:
            await node.contributions.async_help(*budgets[tick])
        m = node.autoserve.model(entry.sha256)
        assert m.budget_mb_override == budgets[ticks[-1]][1]
        path.unlink()
        await wait_until(lambda: f"model {entry.id} removed (its file is gone)" in " ".join(node.activity), 20.0,
                         what="the watch to drop the original")
        await wait_until(lambda: m.entry is other and m.budget_mb_override == 300, 10.0,
                         what="the choice to go on from the copy at the copy's budget")
        assert node.autoserve.model(entry.sha256) is m
        assert node.config.contribute_models == {entry.id: 100, other.id: 300}
        rows = {r["model"]: r for r in node.contributions.summary()["models"]}
        assert rows[other.id]["budget_mb"] == 300 and not rows[other.id]["error"], rows
        assert rows[entry.id]["error"] == "the model is not on this machine now", rows
        await node.contributions.async_stop(entry.id)
        assert node.autoserve.model(entry.sha256) is m and m.entry is other and m.budget_mb_override == 300
        assert node.config.contribute_models == {other.id: 300}


async def test_unticking_one_of_two_helped_copies_leaves_the_others_choice(tmp_path, quick):
    data, models = data_with_models(tmp_path)
    path, copy = copies(models)
    async with running_node(node_config(data, models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("wrongcount")
        other = next(e for e in node.catalog.entries.values() if e.path.name == copy.name)
        await node.contributions.async_help(other.id, 300)
        await node.contributions.async_help(entry.id, 100)
        await node.contributions.async_stop(entry.id)
        m = node.autoserve.model(entry.sha256)
        assert m is not None and m.entry is other and m.budget_mb_override == 300
        [row] = node.contributions.summary()["models"]
        assert row["model"] == other.id and row["budget_mb"] == 300, row


async def test_the_help_serve_models_file_deleted_does_not_go_on_from_a_copy_that_changed(tmp_path, quick):
    """Review r32, 5: the copy the choice went on from could be one whose own file had changed on
    disk (it holds other bytes now): repointed, its load refused, the choice failed instead of ending
    (kept in config.toml for when the file is back)."""
    data, models = data_with_models(tmp_path)
    path = wrong_layer_count(models / "wrongcount.gguf")
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / "wrongcount-copy.gguf"
    copy.write_bytes(path.read_bytes())
    async with running_node(node_config(data, models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("wrongcount")
        summary, _ = await node.model_files.async_add_path(str(copy))
        other = node.catalog.entries[summary["id"]]
        assert other is not entry and other.sha256 == entry.sha256
        data_ = bytearray(copy.read_bytes())
        data_[-1] ^= 0xFF  # written over in place: other bytes (outside the folder: only marked changed)
        copy.write_bytes(bytes(data_))
        st = copy.stat()
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        await node.model_files.watcher.async_look()
        assert other.changed
        await node.contributions.async_help(entry.id, 0)
        await choice_failed(node)
        path.unlink()
        await node.model_files.watcher.async_look()
        assert entry.id not in node.catalog.entries
        await wait_until(lambda: node.autoserve.model(entry.sha256) is None, 10.0,
                         what="the choice to end (not to go on from the changed copy)")
        assert node.config.contribute_models == {entry.id: 0}
