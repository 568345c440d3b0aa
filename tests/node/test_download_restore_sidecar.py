"""A download a stopped node left keeps its size and the sha256 the user gave (the `.part`'s sidecar,
2026-12-07): `--list` said "0.3 MB" with no total until the job was resumed, and the resumed download
no longer checked the hash (`swarmllm download URL --sha256 H` stopped mid-way, then `--resume ID`,
kept a file of other bytes). An older sidecar, without either, still comes back (size unknown)."""

from __future__ import annotations

import json

import pytest

from node.commands.client import _list_line
from tests.node.test_download_restore import api, finished, listed, stopped_mid_download
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.usefixtures("fast_retries")]


async def _stopped_with_hash(data, server, sha256):
    """A real node starts `download URL --sha256 H` and is stopped once 250 kB arrived."""
    server.stall_after = 250_000
    async with running_node(node_config(data)) as node:
        status, body = await api(node, "POST", "/api/admin/models/download",
                                 {"url": server.url, "filename": "kept.gguf", "sha256": sha256})
        assert status == 202, body
        job_id = body["download"]["id"]

        async def arrived():
            _, b = await api(node, "GET", f"/api/admin/downloads/{job_id}")
            return b["download"]["done_bytes"] >= 250_000
        await wait_until(arrived, timeout_s=30, what="bytes arriving")
    server.stall_after = None
    server.release.set()


async def test_a_restored_download_keeps_its_size_and_still_checks_the_hash(tmp_path, server, other_bytes):
    data = tmp_path / "data"
    wrong = "0" * 64  # the user's hash is not the file's: the resumed download must refuse it
    await _stopped_with_hash(data, server, wrong)
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        assert job["state"] == "paused" and job["restored"], job
        assert job["total_bytes"] == len(other_bytes), job  # --list shows the size
        assert f" of {len(other_bytes) / 1e6:.1f} MB" in _list_line(job), _list_line(job)
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
    assert done["state"] == "failed" and "sha256 mismatch" in done["error"], done
    assert not (data / "models" / "kept.gguf").exists()  # not kept under the hash it does not have


async def test_a_restored_download_with_the_right_hash_completes(tmp_path, server, other_bytes):
    import hashlib

    data = tmp_path / "data"
    await _stopped_with_hash(data, server, hashlib.sha256(other_bytes).hexdigest().upper())
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
    assert done["state"] == "done", done
    assert (data / "models" / "kept.gguf").read_bytes() == other_bytes


async def test_an_older_sidecar_without_size_or_hash_still_comes_back(tmp_path, server, other_bytes):
    data = tmp_path / "data"
    server.stall_after = 4096
    await stopped_mid_download(node_config(data), server.url, "kept.gguf", 4096)
    server.stall_after = None
    server.release.set()
    side = data / "models" / "kept.gguf.part.json"
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("total", "sha256")}))  # as before
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        assert job["state"] == "paused" and job["total_bytes"] is None and job["resumable"], job
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
    assert done["state"] == "done", done
    assert (data / "models" / "kept.gguf").read_bytes() == other_bytes
