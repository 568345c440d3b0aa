"""What an origin says of itself is not quoted: a failed download or layer fetch names the status
and its standard phrase, never the server's own reason text (found by a bug hunt, 2026-12-06: an
origin answering `403 Forbidden token=hf_… user ana.garcia` had its words in the download's error,
the log and the diagnostics report, redacted and full)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from node import const
from node.errors import DownloadFailed
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.llama

REASON = "Forbidden token=hf_REASONTOKEN user ana.garcia"


async def _origin(status: int):
    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=status, reason=f"{REASON} ({status})", text="no")

    app = web.Application()
    app.router.add_get("/{path:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # noqa: SLF001


async def _get(node, path):
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}{path}",
                                                   headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return await r.text()


async def test_a_download_refused_with_words_does_not_quote_them(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    monkeypatch.setattr(const, "DOWNLOAD_RETRIES", 2)
    denied, denied_port = await _origin(403)
    busy, busy_port = await _origin(503)
    try:
        async with running_node(node_config(tmp_path / "data", tiny_model(tmp_path))) as node:
            jobs = [node.start_download(f"http://127.0.0.1:{denied_port}/a.gguf"),
                    node.start_download(f"http://127.0.0.1:{busy_port}/b.gguf")]
            await wait_until(lambda: all(j.state == "failed" for j in jobs), 30, what="both downloads to fail")
            assert jobs[0].error.endswith(f"HTTP 403 Forbidden from http://127.0.0.1:{denied_port}/a.gguf"), jobs[0].error
            assert jobs[1].error.endswith("HTTP 503 Service Unavailable"), jobs[1].error
            texts = [await _get(node, "/api/admin/diagnostics"), await _get(node, "/api/admin/diagnostics?full=1"),
                     await _get(node, "/api/admin/downloads"), caplog.text]
    finally:
        await denied.cleanup()
        await busy.cleanup()
    for text in texts:
        assert "REASONTOKEN" not in text and "ana.garcia" not in text


async def test_a_layer_fetch_refused_with_words_does_not_quote_them(tmp_path):
    denied, port = await _origin(403)
    try:
        config = node_config(tmp_path / "data", layers="0-0", models=[f"http://127.0.0.1:{port}/m.gguf"])
        with pytest.raises(DownloadFailed) as failed:
            async with running_node(config):
                pass
    finally:
        await denied.cleanup()
    assert failed.value.message == f"HTTP 403 Forbidden from http://127.0.0.1:{port}/m.gguf"


async def test_a_url_s_directories_are_not_in_the_redacted_report(tmp_path):
    """The redacted report tagged a URL's host and kept its path: `https://<host-…>/ana-garcia/
    private-finetune/resolve/main/x.gguf` names the account and the repository (found by a bug
    hunt, 2026-12-06). Its directories are now `…`; the file's name and the full report keep theirs."""
    denied, port = await _origin(403)
    try:
        async with running_node(node_config(tmp_path / "data", tiny_model(tmp_path))) as node:
            job = node.start_download(f"http://127.0.0.1:{port}/ana-garcia/private-finetune/resolve/main/a.gguf")
            await wait_until(lambda: job.state == "failed", 30, what="the download to fail")
            text = await _get(node, "/api/admin/diagnostics")
            full = await _get(node, "/api/admin/diagnostics?full=1")
    finally:
        await denied.cleanup()
    assert "private-finetune" not in text and "ana-garcia" not in text
    assert f"error=HTTP 403 Forbidden from http://127.0.0.1:{port}/…/a.gguf" in text, text.split("-- downloads --")[1]
    assert f"http://127.0.0.1:{port}/ana-garcia/private-finetune/resolve/main/a.gguf" in full
