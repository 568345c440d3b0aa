"""The downloads panel as a user meets it, against a real node in the app (2026-12-06): a split
model's set downloads as one row that says which part is on the wire (its part 1's name alone read
as one file of it), and a download whose origin stops sending says it is stalled (the bar stood
still while the rate and time left read as if bytes came in)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiohttp import web

from node import const
from node.inference.synth import write_gguf
from tests.app.helpers import DEADLINE_S, http_file, running_app
from tests.node.test_model_file_kinds import rewrite
from tests.support.hubserver import HubServer, serving_hub
from tests.support.nodes import TINY, node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui, pytest.mark.slow]  # the whole app: offscreen Qt warns of raise() (as test_chat_and_downloads)

REPO = "/org/model/resolve/main/"


def test_a_split_set_is_one_row_that_names_the_part_on_the_wire(qtbot, run, data_dir, tiny_model, tmp_path,
                                                                 monkeypatch):
    src = tmp_path / "src.gguf"
    write_gguf(src, dataclasses.replace(TINY, seed=21, name="big"))
    rewrite(src, tmp_path / "big.gguf", split_max_tensors=8)
    parts = {p.name: p.read_bytes() for p in sorted(tmp_path.glob("big-0000?-of-00003.gguf"))}
    names = list(parts)
    seen: list[tuple[str, str, int]] = []

    async def body():
        hub = HubServer(parts[names[0]], REPO + names[0])
        for name in names[1:]:
            hub.add_file(REPO + name, parts[name])
        async with serving_hub(hub, monkeypatch, tmp_path):
            async with running_app(node_config(data_dir, tiny_model)) as app:
                tab = app.window.models_tab
                key = f"file:{names[0]}"

                def record(job) -> None:  # after the panel's own observer: what the user saw then
                    row = tab.downloads.rows.get(key)
                    if row is not None:
                        seen.append((row.title.text(), row.detail.text(), row.bar.value()))

                app.node.downloads.subscribe(record)
                tab.download_url(f"hf://org/model/{names[1]}")
                await wait_until(lambda: key in tab.downloads.rows and
                                 tab.downloads.rows[key].detail.text().startswith("done"), DEADLINE_S,
                                 what="the set to download")
                assert list(tab.downloads.rows) == [key]  # one row for the set
                title = tab.downloads.rows[key].title.text()
                assert "3 parts" in title, title
                details = [d for _t, d, _v in seen]
                assert any(d.startswith("part 2 of 3 · ") for d in details), details
                assert any(d.startswith("part 3 of 3 · ") for d in details), details
                values = [v for _t, _d, v in seen]
                assert values == sorted(values) and values[-1] == 1000, values  # one bar over the set
                assert "this device only" in tab.downloads.rows[key].detail.text()

    run(body())


def test_a_download_whose_origin_stops_sending_says_it_is_stalled(qtbot, run, data_dir, tiny_model, tmp_path,
                                                                  monkeypatch):
    other = tmp_path / "slow.gguf"
    write_gguf(other, dataclasses.replace(TINY, seed=13, name="slow", vocab=4096))
    data = other.read_bytes()
    stall = asyncio.Event()
    monkeypatch.setattr(const, "DOWNLOAD_STALLED_S", 1.0)
    monkeypatch.setattr(const, "DOWNLOAD_STALL_CHECK_S", 0.2)

    async def serve(request):
        resp = web.StreamResponse(headers={"ETag": '"v1"'})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 3])
        await stall.wait()  # then nothing, as an origin that hangs
        return resp

    async def body():
        async with http_file("/slow.gguf", serve) as url:
            try:
                async with running_app(node_config(data_dir, tiny_model)) as app:
                    tab = app.window.models_tab
                    tab.download_url(url)
                    await wait_until(lambda: "file:slow.gguf" in tab.downloads.rows and
                                     tab.downloads.rows["file:slow.gguf"].bar.value() >= 300, DEADLINE_S,
                                     what="a third downloaded")
                    row = tab.downloads.rows["file:slow.gguf"]
                    await wait_until(lambda: "stalled: no data for" in row.detail.text(), DEADLINE_S,
                                     what="the row to say it is stalled")
                    assert "left" not in row.detail.text() and "MiB/s" not in row.detail.text(), row.detail.text()
                    assert not row.pause_button.isHidden() and row.pause_button.text() == "Pause"
                    row.pause_button.click()
                    await wait_until(lambda: row.detail.text().startswith("paused"), DEADLINE_S, what="paused")
                    assert not tab.downloads._stall_timer.isActive()  # noqa: SLF001
            finally:
                stall.set()

    run(body())


def test_a_download_a_stopped_node_left_is_shown_paused_and_resumes(qtbot, run, data_dir, tiny_model, tmp_path):
    """2026-12-06: a download cut by the node's stop (the app quit, a laptop closed) lived only in
    memory: after the restart the panel was hidden and nothing said the bytes kept."""
    from tests.support.fileserver import FileServer
    from tests.support.nodes import running_node

    other = tmp_path / "kept-src.gguf"
    write_gguf(other, dataclasses.replace(TINY, seed=17, name="kept", vocab=4096))
    data = other.read_bytes()

    async def body():
        server = FileServer(data)
        server.stall_after = len(data) // 3
        await server.start()
        try:
            async with running_node(node_config(data_dir, tiny_model)) as node:  # the earlier run
                job = node.downloads.start(server.url, file_name="kept.gguf")
                await wait_until(lambda: job.done_bytes >= len(data) // 3, DEADLINE_S, what="a third downloaded")
            server.stall_after = None
            server.release.set()
            server.requests.clear()
            async with running_app(node_config(data_dir, tiny_model)) as app:
                panel = app.window.models_tab.downloads
                await wait_until(lambda: "file:kept.gguf" in panel.rows, DEADLINE_S, what="the kept download's row")
                row = panel.rows["file:kept.gguf"]
                assert panel.isVisibleTo(app.window.models_tab)
                assert row.detail.text().startswith("paused"), row.detail.text()
                assert "kept from an earlier run" in row.detail.text(), row.detail.text()
                assert not row.pause_button.isHidden() and row.pause_button.text() == "Resume"
                assert not row.cancel_button.isHidden()
                row.pause_button.click()
                await wait_until(lambda: row.detail.text().startswith("done"), DEADLINE_S, what="the resumed download")
                assert server.requests == [{"range": f"bytes={len(data) // 3}-", "if_range": '"v1"'}]
                assert (data_dir / "models" / "kept.gguf").read_bytes() == data
        finally:
            server.release.set()
            await server.stop()

    run(body())
