"""A download's last steps are the rename of its `.part` into models/ and the delete of its sidecar
(`partfile.land`). A crash or kill -9 between the two leaves the file, complete and checked, beside a
sidecar whose `.part` is gone. The next start must read it as landed: the model served, no download
listed, none fetched again. Until 2026-12-07 the sidecar stayed in models/ for good (each such crash
left one); now the start removes the sidecar of a landed file (of a split set: once part 1, which
lands last, is there; before that it marks a landing to finish, `partfile.cut_landing`)."""

from __future__ import annotations

import json
import logging
import os

import pytest

from node.models.download.restore import finish_linked_landings
from tests.node.test_download_restore import api, finished, listed
from tests.support.nodes import node_config, running_node

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.usefixtures("fast_retries")]


async def _downloaded(data, url: str) -> dict:
    """kept.gguf downloaded by a node of `data`, which is then stopped: the finished job."""
    async with running_node(node_config(data)) as node:
        status, body = await api(node, "POST", "/api/admin/models/download", {"url": url, "filename": "kept.gguf"})
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        return done


async def test_a_sidecar_left_by_a_crash_after_the_rename_is_not_read_as_a_download(tmp_path, server, other_bytes,
                                                                                   caplog):
    data = tmp_path / "data"
    done = await _downloaded(data, server.url)
    model_id = done["model_id"]
    models = data / "models"
    # the crash: renamed, its sidecar not yet deleted (as the download wrote it)
    sidecar = models / "kept.gguf.part.json"
    sidecar.write_text(json.dumps({"url": server.url, "validator": '"v1"', "job": done["id"],
                                   "total": len(other_bytes)}))
    # a split set's part 2 landed, its part 1 not yet (that sidecar marks a landing to finish), and a
    # sidecar whose download died before its `.part` was made
    (models / "split-00002-of-00003.gguf").write_bytes(other_bytes)
    (models / "split-00002-of-00003.gguf.part.json").write_text(json.dumps({"url": server.url, "validator": '"v1"'}))
    (models / "gone.gguf.part.json").write_text(json.dumps({"url": server.url, "validator": '"v1"'}))
    server.requests.clear()
    caplog.set_level(logging.INFO, logger="node.models.download")
    async with running_node(node_config(data)) as node:
        assert await listed(node) == []
        assert model_id in node.catalog.entries
        assert not sidecar.exists(), "the landed file's sidecar stayed"
        assert (models / "split-00002-of-00003.gguf.part.json").exists()  # (part 1 not landed: kept)
        assert not (models / "gone.gguf.part.json").exists()
        assert any("sidecar" in r.getMessage() and "kept.gguf" in r.getMessage() for r in caplog.records)
        status, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "kept.gguf"})
        assert status == 409 and "already exists" in body["error"]["message"], body
        assert server.requests == []
    assert (models / "kept.gguf").read_bytes() == other_bytes


async def test_a_crash_between_the_hard_link_and_the_parts_delete_is_read_as_landed(tmp_path, server, other_bytes,
                                                                                 caplog):
    """`partfile._place` lands a `.part` by a hard link, then deletes the `.part`, then the sidecar. A
    crash after the link left the file twice (one inode): until 2026-12-07 the next start served the
    model and listed a paused download of it whose Resume said "already exists"."""
    data = tmp_path / "data"
    done = await _downloaded(data, server.url)
    model_id = done["model_id"]
    models = data / "models"
    part, sidecar = models / "kept.gguf.part", models / "kept.gguf.part.json"
    os.link(models / "kept.gguf", part)  # the crash: linked, not yet deleted (nor its sidecar)
    sidecar.write_text(json.dumps({"url": server.url, "validator": '"v1"', "job": done["id"],
                                   "total": len(other_bytes)}))
    server.requests.clear()
    caplog.set_level(logging.INFO, logger="node.models.download")
    async with running_node(node_config(data)) as node:
        assert await listed(node) == []
        assert model_id in node.catalog.entries
        assert not part.exists() and not sidecar.exists()
        assert any("landing" in r.getMessage() and "kept.gguf.part" in r.getMessage() for r in caplog.records)
        assert server.requests == []
    assert (models / "kept.gguf").read_bytes() == other_bytes


async def test_a_split_part_linked_when_the_crash_came_lands_as_what_it_was(tmp_path):  # noqa: RUF029
    """Of a set landing (part 1, which lands last, still a `.part`) a linked later part goes back to
    its `.part` alone, the set lands again when resumed; a part fetched alone (part 1 landed before)
    is landed: review r74, its target was removed from a model already served."""
    def linked(name: str) -> None:
        (tmp_path / name).write_bytes(name.encode())
        os.link(tmp_path / name, tmp_path / f"{name}.part")
        (tmp_path / f"{name}.part.json").write_text("{}")

    # a set landing: part 3 landed, part 2 linked when the crash came, part 1 still a .part
    (tmp_path / "s-00001-of-00003.gguf.part").write_bytes(b"1")
    linked("s-00002-of-00003.gguf")
    (tmp_path / "s-00003-of-00003.gguf").write_bytes(b"3")
    # a part fetched alone, of a set whose other parts are here
    (tmp_path / "a-00001-of-00002.gguf").write_bytes(b"1")
    linked("a-00002-of-00002.gguf")
    assert sorted(finish_linked_landings(tmp_path)) == ["a-00002-of-00002.gguf.part", "s-00002-of-00003.gguf.part"]
    assert (tmp_path / "s-00002-of-00003.gguf.part").exists() and not (tmp_path / "s-00002-of-00003.gguf").exists()
    assert (tmp_path / "s-00002-of-00003.gguf.part.json").exists()  # (the set's landing to finish)
    assert (tmp_path / "a-00002-of-00002.gguf").read_bytes() == b"a-00002-of-00002.gguf"
    assert not (tmp_path / "a-00002-of-00002.gguf.part").exists()
    assert not (tmp_path / "a-00002-of-00002.gguf.part.json").exists()
