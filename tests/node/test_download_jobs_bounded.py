"""A node left running for weeks keeps a bounded list of finished downloads.

Found by the 2026-12-07 soak: every download of the run stayed in `DownloadRunner.jobs` for good
(done, failed and cancelled ones, each with its task and its error), so a script or a user retrying
a bad link grew the node's memory and `GET /api/admin/downloads` (which the GUI and `swarmllm
download --list` read) by one job per try, without end. Now at most DOWNLOADS_FINISHED_KEPT
finished ones are kept, the oldest forgotten first; a paused download (its partial file on disk)
and a running one are never forgotten.

A real node, a local HTTP origin answering 404, and the admin API as a client uses it."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from node import const
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

KEPT = 4  # DOWNLOADS_FINISHED_KEPT for this test
TRIES = 3 * KEPT


@pytest.fixture
async def origin():
    """An origin whose /slow.gguf sends its first bytes and then nothing; any other file is a 404
    (that download fails at once)."""
    release = asyncio.Event()

    async def serve(request: web.Request) -> web.StreamResponse:
        if request.match_info["name"] != "slow.gguf":
            return web.Response(status=404, text="no such file")
        resp = web.StreamResponse()
        resp.content_length = 1 << 20
        await resp.prepare(request)
        await resp.write(b"GGUF" + bytes(4092))
        await release.wait()
        return resp

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
    release.set()
    await runner.cleanup()


async def test_finished_downloads_are_bounded(tmp_path, origin, monkeypatch):
    monkeypatch.setattr(const, "DOWNLOADS_FINISHED_KEPT", KEPT, raising=False)
    async with running_node(node_config(tmp_path / "data")) as node, aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{node.api.port}", headers={"Authorization": f"Bearer {node.api_key}"}) as s:
        async def state(job_id: str) -> str | None:
            async with s.get(f"/api/admin/downloads/{job_id}") as r:
                return (await r.json())["download"]["state"] if r.status == 200 else None

        async with s.post("/api/admin/models/download", json={"url": f"{origin}/slow.gguf"}) as r:
            paused = (await r.json())["download"]["id"]
        await wait_until(lambda: _in(state, paused, ("downloading",)), 30, 0.05, "the slow download to run")
        async with s.post(f"/api/admin/downloads/{paused}/pause") as r:
            assert r.status == 200
        await wait_until(lambda: _in(state, paused, ("paused",)), 30, 0.05, "the slow download to pause")

        ids = []
        for i in range(TRIES):
            async with s.post("/api/admin/models/download", json={"url": f"{origin}/m{i}.gguf"}) as r:
                body = await r.json()
                assert r.status == 202, body
            ids.append(body["download"]["id"])
            # each one fails (a 404 is not asked again), as a script retrying a bad link sees
            assert await wait_until(lambda job_id=ids[-1]: _in(state, job_id, ("failed", "done", "cancelled")),
                                    30, 0.05, f"download {i} to fail") == "failed"

        async with s.get("/api/admin/downloads") as r:
            listed = [d["id"] for d in (await r.json())["downloads"]]
        assert listed == [paused, *ids[-KEPT:]]  # the paused one, and the most recent finished, oldest first
        assert len(node.downloads.jobs) == KEPT + 1
        assert await state(ids[0]) is None  # forgotten: 404
        assert await state(paused) == "paused"  # its partial file can still be resumed or cancelled


async def _in(state, job_id: str, states: tuple[str, ...]) -> str | None:
    now = await state(job_id)
    return now if now in states else None
