"""A download that fills the disk (a 8 MB tmpfs for the data dir; the file sent without a length,
so the free-space check before the download cannot refuse it): the job fails saying the disk is
full, where, and what to do with the partial file it keeps; no model is made of it, and the node
goes on serving what it had.

Found by hand on 2026-12-06: the job's error (the Models tab, `swarmllm download`) was "OSError: No
space left on device", naming neither the folder nor the partial file that now filled the disk."""

from __future__ import annotations

import os
import shutil
import subprocess

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama,
              pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or not shutil.which("mount"),
                                 reason="needs root to mount a small tmpfs")]

TMPFS_MB = 8
SENT_MB = 12


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def _chunked_origin(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()  # no Content-Length: nothing to check the free space against
    await resp.prepare(request)
    await resp.write(b"GGUF" + bytes(64 * 1024 - 4))
    for _ in range(SENT_MB * 16 - 1):
        await resp.write(bytes(64 * 1024))
    await resp.write_eof()
    return resp


async def test_a_download_that_fills_the_disk_says_so_and_the_node_serves_on(tmp_path, small_disk):
    app = web.Application()
    app.router.add_get("/big.gguf", _chunked_origin)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/big.gguf"
    try:
        async with running_node(node_config(small_disk / "data", tiny_model(tmp_path))) as node:
            base, auth = f"http://127.0.0.1:{node.api.port}", {"Authorization": f"Bearer {node.api_key}"}
            async with aiohttp.ClientSession(headers=auth) as s:
                async with s.post(base + "/api/admin/models/download", json={"url": url}) as r:
                    job_id = (await r.json())["download"]["id"]
                job = {}

                async def ended():
                    async with s.get(f"{base}/api/admin/downloads/{job_id}") as r:
                        job.update((await r.json())["download"])
                    return job["state"] not in ("starting", "downloading", "verifying")
                await wait_until(ended, 60, what="the download to end")
            models = small_disk / "data" / "models"
            assert job["state"] == "failed", job
            assert "disk is full" in job["error"] and str(models) in job["error"], job["error"]
            assert str(models / "big.gguf.part") in job["error"] and "delete it" in job["error"], job["error"]
            assert not (models / "big.gguf").exists()
            assert [m.id for m in node.models.all() if "big" in m.id] == []
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=node.api_key, max_retries=0)
            model_id = node.models.all()[0].id
            reply = await client.chat.completions.create(model=model_id, max_tokens=3,
                                                         messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].finish_reason in ("length", "stop")
    finally:
        await runner.cleanup()
