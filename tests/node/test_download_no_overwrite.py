"""A download lands in models/NAME only if nothing is there. `start()` refuses a name already taken,
but until 2026-12-07 (review r65) a file put there while the download ran (the user's own copy,
another tool's) was overwritten without a word by the landing's rename. Now the landing never
replaces a file (`partfile.land`: a hard link, or a check then a rename where the file system has no
hard links): the job fails saying so, its `.part` is kept, and a Resume once the file is moved away
lands it."""

from __future__ import annotations

import errno
import os

import pytest

from node.models.download import partfile
from tests.node.test_download_restore import api, finished, job_of
from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("fast_retries")


@pytest.mark.asyncio(loop_scope="function")
async def test_a_file_put_at_the_name_while_it_downloads_is_not_overwritten(tmp_path, server, other_bytes):
    users = tiny_model(tmp_path, TINY, "users.gguf").read_bytes()
    server.stall_after = 100_000
    async with running_node(node_config(tmp_path / "data", models_watch_s=0.05)) as node:
        models = node.data_dir / "models"
        status, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "kept.gguf"})
        assert status == 202, body
        job_id = body["download"]["id"]
        await wait_until(lambda: server.sent >= 100_000, 30.0, what="the download under way")
        (models / "kept.gguf").write_bytes(users)  # the user's own copy, put there meanwhile
        server.stall_after = None
        server.release.set()
        job = await finished(node, job_id)
        assert job["state"] == "failed", job
        assert "models/kept.gguf appeared while the download ran" in job["error"], job
        assert job["resumable"], job
        assert (models / "kept.gguf").read_bytes() == users, "the user's file was overwritten"
        assert (models / "kept.gguf.part").read_bytes() == other_bytes

        (models / "kept.gguf").rename(tmp_path / "users-aside.gguf")
        status, body = await api(node, "POST", f"/api/admin/downloads/{job_id}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        assert (models / "kept.gguf").read_bytes() == other_bytes
        assert not (models / "kept.gguf.part").exists()
        assert done["model_id"] in node.catalog.entries
        assert (await job_of(node, job_id))["resumed_as"] == done["id"]


@pytest.mark.parametrize("hard_links", [True, False])
def test_landing_never_replaces_a_file_and_puts_a_set_back(tmp_path, monkeypatch, hard_links):
    """A set lands part 1 last: part 1's name taken, part 2 (landed already) goes back to its .part."""
    if not hard_links:  # a FAT or exFAT drive: os.link refused, a check then a rename
        def no_link(src, dst):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_link)
    names = ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    parts = [tmp_path / f"{n}.part" for n in names]
    targets = [tmp_path / n for n in names]
    for i, part in enumerate(parts):
        part.write_bytes(b"part %d" % i)
        partfile.sidecar(part).write_text("{}")
    targets[0].write_bytes(b"the user's")
    with pytest.raises(FileExistsError) as raised:
        partfile.land(parts, targets)
    assert raised.value.filename == str(targets[0])
    assert targets[0].read_bytes() == b"the user's"
    assert [p.read_bytes() for p in parts] == [b"part 0", b"part 1"] and not targets[1].exists()
    assert all(partfile.sidecar(p).exists() for p in parts)

    targets[0].unlink()
    partfile.land(parts, targets)
    assert [t.read_bytes() for t in targets] == [b"part 0", b"part 1"]
    assert not any(p.exists() or partfile.sidecar(p).exists() for p in parts)
