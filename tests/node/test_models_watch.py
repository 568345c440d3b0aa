"""Adding and removing models on a running node (2026-12-06).

Until then a headless user who copied a GGUF into the data dir's models/ had to restart the node, a
model whose file was deleted stayed in /v1/models, and there was no admin API to serve a file by
path (only the GUI's "Add model file…"). Now the node looks at models/ while it runs (a copy still
being written is not taken; a `.part` never is; a loaded model stays until unloaded), and
`POST /api/admin/models/add {"path"}` / `swarmllm models add PATH` serve a file from anywhere."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import logging
import shutil

import aiohttp
import pytest
import pytest_asyncio

from node.commands.client import models as models_command
from node.datadir import MODELS_DIR
from tests.support.nodes import TINY, node_config, openai_client, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

COPIED = dataclasses.replace(TINY, seed=11, name="copied")
ELSEWHERE = dataclasses.replace(TINY, seed=12, name="elsewhere")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("modelwatch")
    own = tiny_model(base, TINY, "own.gguf")
    async with running_node(node_config(base / "data", own, models_watch_s=0.05)) as n:
        yield n


@pytest.fixture(scope="module")
def client(node):
    """Made off the loop: the SDK builds its types on first use."""
    return openai_client(node)


async def listed(client) -> set[str]:
    """/v1/models through the official client."""
    return {m.id async for m in client.models.list()}


async def looks_later(node, n: int = 3) -> None:
    """Wait until the models folder has been looked at `n` more times."""
    target = node.model_files.watcher.looks + n
    await wait_until(lambda: node.model_files.watcher.looks >= target, 30.0, 0.02, f"{n} looks at models/")


async def admin(node, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, f"http://127.0.0.1:{node.api.port}{path}", json=body,
                                                       headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, json.loads(await r.text())


def append(path, chunk: bytes) -> None:
    """A copy's next write (small: the test's files are tiny)."""
    with open(path, "ab") as fh:
        fh.write(chunk)


def ids_named(node, name: str) -> list[str]:
    return [e.id for e in node.catalog.entries.values() if e.name == name]


async def test_a_copy_under_way_is_taken_once_complete(tmp_path):
    """Looks driven by hand (the watch's own task off): each look between two writes sees the file
    grow, so it is neither taken nor refused; a copy that stalls is refused as truncated and tried
    again once it grows; a `.part` is never a model."""
    data = tiny_model(tmp_path, COPIED, "copied.gguf").read_bytes()
    async with running_node(node_config(tmp_path / "data", models_watch_s=0)) as node:
        watcher, models_dir = node.model_files.watcher, node.data_dir / MODELS_DIR
        (models_dir / "download.gguf.part").write_bytes(data)
        target = models_dir / "copied.gguf"
        step = len(data) // 4
        for i in range(3):
            append(target, data[i * step:(i + 1) * step])
            await watcher.async_look()
            assert ids_named(node, "copied") == [] and target not in node.catalog.skipped, i
        await watcher.async_look()  # stalled: the same size twice
        assert "truncated" in node.catalog.skipped[target]
        append(target, data[3 * step:])
        await watcher.async_look()
        assert ids_named(node, "copied") == []
        await watcher.async_look()
        assert target not in node.catalog.skipped
        model_id = ids_named(node, "copied")[0]
        assert node.models.registered(model_id) is not None
        assert not any(e.path.name.endswith(".part") or e.name.startswith("download") for e in node.catalog.entries.values())


async def test_a_file_copied_in_is_served_and_leaves_when_deleted(node, client, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="node.models.watch")
    target = node.data_dir / MODELS_DIR / "copied.gguf"
    shutil.copyfile(tiny_model(tmp_path, COPIED, "copied.gguf"), target)
    await wait_until(lambda: ids_named(node, "copied"), 30.0, 0.05, "the copied file in the catalog")
    model_id = ids_named(node, "copied")[0]
    await wait_until(lambda: node.models.registered(model_id) is not None, 30.0, 0.05, "its registration")
    assert model_id in await listed(client)
    assert any("model file in the models folder served" in r.getMessage() and model_id in r.getMessage()
               for r in caplog.records)

    served = node.models.registered(model_id)
    heard = []
    unsubscribe = node.models.subscribe(lambda event, m: heard.append((event, m.id)))
    target.unlink()
    await wait_until(lambda: model_id not in node.catalog.entries, 30.0, 0.05, "the deleted file's model to leave")
    assert model_id not in await listed(client)
    assert any("model removed, its file is gone" in r.getMessage() for r in caplog.records)
    # a request that resolved the model before it left ends after: no "changed" brings its row back
    node.models.mark(served, busy=False)
    unsubscribe()
    assert heard == [("removed", model_id)], heard


async def test_a_loaded_model_whose_file_is_deleted_stays_until_unloaded(node, client, tmp_path):
    path = node.data_dir / MODELS_DIR / "loaded.gguf"
    shutil.copyfile(tiny_model(tmp_path, dataclasses.replace(TINY, seed=13, name="loaded"), "src.gguf"), path)
    await wait_until(lambda: ids_named(node, "loaded"), 30.0, 0.05, "the copied file in the catalog")
    model_id = ids_named(node, "loaded")[0]
    await wait_until(lambda: node.models.registered(model_id) is not None, 30.0, 0.05, "its registration")
    status, _ = await admin(node, "POST", f"/api/admin/models/{model_id}/load")
    assert status == 200
    path.unlink()
    await looks_later(node)
    assert model_id in await listed(client), "a loaded model was dropped with its file"
    status, _ = await admin(node, "POST", f"/api/admin/models/{model_id}/unload")
    assert status == 200
    await wait_until(lambda: model_id not in node.catalog.entries, 30.0, 0.05, "the unloaded model to leave")
    assert model_id not in await listed(client)


async def test_a_loaded_model_whose_file_moved_is_given_its_file_again_by_an_add(node, client, tmp_path):
    """2026-12-07, review r65: its file moved (the row says it cannot be reloaded), the user Adds it
    from its new place: told "served already", the row still said file deleted, and after Unload the
    model left although its file had just been added. Now the add gives the model that file."""
    path = tiny_model(tmp_path, dataclasses.replace(TINY, seed=14, name="moved"), "moved.gguf")
    status, body = await admin(node, "POST", "/api/admin/models/add", {"path": str(path), "load": True})
    assert status == 201 and body["model"]["state"] == "loaded", body
    model_id = body["model"]["id"]
    moved = tmp_path / "elsewhere" / "moved.gguf"
    moved.parent.mkdir()
    path.rename(moved)
    await wait_until(lambda: node.catalog.entries[model_id].file_gone, 30.0, 0.05, "its file marked gone")
    heard: list[tuple[str, bool]] = []
    unsubscribe = node.models.subscribe(lambda event, m: heard.append((event, m.entry.file_gone)))
    try:
        status, body = await admin(node, "POST", "/api/admin/models/add", {"path": str(moved)})
    finally:
        unsubscribe()
    assert status == 201 and body["added"] is True and body["model"]["id"] == model_id, body
    assert body["model"]["file_gone"] is False and body["model"]["state"] == "loaded", body
    assert ("changed", False) in heard  # the Models tab's row follows
    status, _ = await admin(node, "POST", f"/api/admin/models/{model_id}/unload")
    assert status == 200
    await looks_later(node)
    assert model_id in await listed(client), "the unloaded model left although its file was added"
    status, body = await admin(node, "POST", f"/api/admin/models/{model_id}/load")
    assert status == 200 and body["model"]["state"] == "loaded", body
    await admin(node, "POST", f"/api/admin/models/{model_id}/unload")


async def test_admin_add_serves_a_file_from_anywhere_once(node, client, tmp_path):
    path = tiny_model(tmp_path, ELSEWHERE, "elsewhere.gguf")
    (tmp_path / "notes.gguf").write_text("not a model")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for bad, words in ((tmp_path / "missing.gguf", "not found"), (tmp_path / "notes.gguf", "not a GGUF"),
                       (truncated, "truncated"), (tmp_path, "directory")):
        status, body = await admin(node, "POST", "/api/admin/models/add", {"path": str(bad)})
        assert status == 400 and words in body["error"]["message"], (bad, body)
    status, body = await admin(node, "POST", "/api/admin/models/add", {"path": "relative.gguf"})
    assert status == 400 and "absolute" in body["error"]["message"]

    status, body = await admin(node, "POST", "/api/admin/models/add", {"path": str(path)})
    assert status == 201 and body["added"] is True, body
    model_id = body["model"]["id"]
    assert model_id in await listed(client)
    status, body = await admin(node, "POST", "/api/admin/models/add", {"path": str(path), "load": True})
    assert status == 200 and body["added"] is False and body["model"]["id"] == model_id
    assert body["model"]["state"] == "loaded"
    assert ids_named(node, "elsewhere") == [model_id]


async def test_models_add_command(node, client, tmp_path, monkeypatch):
    path = tiny_model(tmp_path, dataclasses.replace(TINY, seed=14, name="bycli"), "bycli.gguf")
    monkeypatch.chdir(tmp_path)  # a relative path is the command's, made absolute before it is sent
    args = argparse.Namespace(port=node.api.port, data_dir=str(node.data_dir), json=False, action="add",
                              path="bycli.gguf", load=False)

    def run() -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert models_command(args) == 0
        return out.getvalue()
    text = await asyncio.get_running_loop().run_in_executor(None, run)
    model_id = ids_named(node, "bycli")[0]
    assert text.startswith(f"added: model {model_id}") and str(path) in text, text
    assert model_id in await listed(client)
