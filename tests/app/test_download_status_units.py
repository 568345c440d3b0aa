"""A download started from the Models tab's Download… said its progress twice, in two units: the
status line in MB (10^6 bytes) and the progress row under it in MiB, so the same bytes read as
"3.1 / 9.4 MB (33%, …)" over "3.0 MiB of 9.0 MiB · …" (seen under Xvfb with a 64 MiB download:
"21.0 / 67.1 MB" over "20.0 MiB of 64.0 MiB", and the rate likewise). The status line now uses
the row's units. A real node and a local HTTP server with a download held at a third."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from app.ui import fmt
from tests.app.helpers import DEADLINE_S, http_file, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]

SIZE = 9 * 2**20


def test_download_status_line_and_progress_row_use_the_same_units(qtbot, run, data_dir, tiny_model):
    data = b"GGUF" + bytes(SIZE - 4)  # its first bytes are what is checked while it downloads
    cut = SIZE // 3
    stall = asyncio.Event()

    async def serve(request):
        resp = web.StreamResponse(headers={"ETag": '"v1"'})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[:cut])
        await stall.wait()  # held there, as a slow origin
        return resp

    async def body():
        async with http_file("/held.gguf", serve) as url:
            try:
                async with running_app(node_config(data_dir, tiny_model)) as app:
                    tab = app.window.models_tab
                    tab.download_url(url)
                    await wait_until(lambda: "file:held.gguf" in tab.downloads.rows
                                     and f"{fmt.size(cut)} of" in tab.downloads.rows["file:held.gguf"].detail.text(),
                                     DEADLINE_S, what="a third downloaded, in the progress row")
                    await wait_until(lambda: "(33%" in tab.status.full_text, DEADLINE_S, what="the status line at 33%")
                    line, row = tab.status.full_text, tab.downloads.rows["file:held.gguf"].detail.text()
                    assert f"{fmt.size(cut)} of {fmt.size(SIZE)}" in line, (line, row)
                    assert " MB" not in line, (line, row)
            finally:
                stall.set()

    run(body())
