"""The first-run banner follows what it names that changes with no state change: a file the
folder watch skips, a download under way. Read again at the folder watch's pace, redrawn only
when its text changes.

Seen: the banner was refreshed on state changes only. With no model, a truncated copy dropped into
the models folder was never named (the state stays "no model"), and a download started from the
Models tab left it saying only how to add a model, however far the download got.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from app.host import AppState
from tests.app.helpers import DEADLINE_S, http_file, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def test_the_banner_names_a_skipped_file_and_a_download_without_a_state_change(qtbot, run, data_dir, tiny_model):
    release = asyncio.Event()

    async def stall(request):  # a quarter of a GGUF, then nothing until the test ends
        resp = web.StreamResponse()
        resp.content_length = 1_000_000
        await resp.prepare(request)
        await resp.write(b"GGUF" + b"\0" * 249_996)
        await release.wait()
        return resp

    async def body():
        async with http_file("/slow.gguf", stall) as url:
            try:
                async with running_app(node_config(data_dir, models_watch_s=0.1), tray_available=True) as app:
                    assert app.host.state == AppState.NO_MODEL
                    banners = [app.window.overview_tab.banner, app.window.models_tab.banner]
                    states: list[str] = []
                    app.host.state_changed.connect(states.append)
                    broken = data_dir / "models" / "broken-copy.gguf"
                    broken.parent.mkdir(parents=True, exist_ok=True)
                    whole = tiny_model.read_bytes()
                    broken.write_bytes(whole[: len(whole) // 3])
                    await wait_until(lambda: all("Not served: broken-copy.gguf is truncated" in b.text.text()
                                                 for b in banners), DEADLINE_S, what="the skipped file in both banners")

                    app.window.models_tab.download_url(url)
                    await wait_until(lambda: all("Downloading slow.gguf: 25%" in b.text.text() for b in banners),
                                     DEADLINE_S, what="the download's progress in the banners")
                    assert states == [], "the state changed: this test is not about a stale state"

                    # nothing changes now: the timer's reads redraw nothing
                    drawn: list[str] = []
                    banner = banners[0]
                    banner.text.setText = drawn.append  # (the banner's own calls go through this)
                    ticks = [0]
                    app.window.models_tab.folder_timer.timeout.connect(lambda: ticks.__setitem__(0, ticks[0] + 1))
                    await wait_until(lambda: ticks[0] >= 3, DEADLINE_S, what="three timer ticks")
                    assert drawn == []
            finally:
                release.set()

    run(body())
