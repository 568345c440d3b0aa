"""The same model file added twice at once (a double-click on the app's Add, `models add` run twice,
two scripts POSTing /api/admin/models/add): until 2026-12-07 both adds hashed the file and raced on
its registration, and the second was told 404 "not ready on this node yet" (the first still reading
its vocabulary), or both were told 201 "added", with "load": true a 404 for the second. Now the adds
of one file are one: the first registers it, the second waits for it and is told 200, added false,
with the same model."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp
import pytest
import pytest_asyncio

from tests.support.nodes import TINY, node_config, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("addtwice")
    async with running_node(node_config(base / "data", tiny_model(base, TINY, "own.gguf"))) as n:
        yield n


async def add(node, path, **extra) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}/api/admin/models/add",
                                                    json={"path": str(path), **extra},
                                                    headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, json.loads(await r.text())


@pytest.mark.parametrize("load", [False, True])
async def test_the_same_file_added_twice_at_once_is_one_model(node, tmp_path, load):
    path = tiny_model(tmp_path, dataclasses.replace(TINY, seed=21 + load, name=f"twice{int(load)}"), "twice.gguf")
    heard: list[tuple[str, str]] = []
    unsubscribe = node.models.subscribe(lambda event, m: heard.append((event, m.id)))
    try:
        answers = await asyncio.gather(add(node, path, load=load), add(node, path, load=load))
    finally:
        unsubscribe()
    assert sorted(status for status, _ in answers) == [200, 201], answers
    assert sorted(body["added"] for _, body in answers) == [False, True], answers
    ids = {body["model"]["id"] for _, body in answers}
    assert len(ids) == 1, answers
    model_id = ids.pop()
    assert [e.id for e in node.catalog.entries.values() if e.path == path] == [model_id]
    assert [m for event, m in heard if event == "added"] == [model_id]
    if load:
        assert {body["model"]["state"] for _, body in answers} == {"loaded"}, answers


@pytest.mark.parametrize("how", ["linked-folder", "dotdot"])
async def test_one_file_added_at_once_by_two_spellings_is_one_model(node, tmp_path, how):
    """2026-12-07, review r65: the adds of one path ran one after the other, but another spelling of
    the same file (through a linked folder, with `..`) still raced: one was told 404 "not ready on
    this node yet". Adds of one content now wait for each other, whatever the path says."""
    real = tmp_path / "real"
    real.mkdir()
    path = tiny_model(real, dataclasses.replace(TINY, seed=31 + len(how), name=f"spelt{len(how)}"), "spelt.gguf")
    if how == "linked-folder":
        (tmp_path / "link").symlink_to(real, target_is_directory=True)
        other = tmp_path / "link" / "spelt.gguf"
    else:
        other = real / ".." / "real" / "spelt.gguf"
    answers = await asyncio.gather(add(node, path, load=True), add(node, other, load=True))
    assert sorted(status for status, _ in answers) == [200, 201], answers
    assert {body["model"]["id"] for _, body in answers} == {f"spelt-{answers[0][1]['model']['sha256'][:8]}"}
    assert {body["model"]["state"] for _, body in answers} == {"loaded"}, answers
