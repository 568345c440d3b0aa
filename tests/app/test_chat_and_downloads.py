"""The Chat tab against the node's own API (streaming, the route badge and timings, a second turn
with the conversation, Stop cancelling the request on the node), the event loop while a chat
streams in the GUI, and the downloads panel's progress bar through a pause and a resume against a
local HTTP server with Range."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

import pytest
from aiohttp import web
from PySide6.QtCore import QTimer

from node.inference.synth import write_gguf
from tests.app.helpers import DEADLINE_S, http_file, running_app
from tests.support.nodes import TINY, node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_chat_streams_shows_the_route_and_keeps_the_conversation(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            chat = app.window.chat_tab
            await wait_until(lambda: chat.picker.count() == 1 and chat.send_button.isEnabled(), DEADLINE_S,
                             what="the model in the chat's picker")
            assert chat.picker.currentText().startswith("tiny")
            chat.prompt.setText("hello there")
            chat.send_button.click()
            assert chat.stop_button.isEnabled() and not chat.send_button.isEnabled()
            await wait_until(lambda: not chat.busy, DEADLINE_S, what="the reply")
            assert chat.messages[0] == {"role": "user", "content": "hello there"}
            assert chat.messages[1]["role"] == "assistant" and chat.messages[1]["content"]
            assert chat.messages[1]["content"] in chat.transcript.toPlainText()
            assert chat.route_badge.text().strip() == "local"
            assert chat.stats.text().startswith("TTFT ") and " tok/s" in chat.stats.text()
            trace = app.node.traces.recent[-1]
            assert trace.outcome == "ok" and trace.route == "local"
            first_prompt = trace.prompt_tokens
            await (chat.send("and again"))  # the second turn carries the first
            assert [m["role"] for m in chat.messages] == ["user", "assistant", "user", "assistant"]
            assert app.node.traces.recent[-1].prompt_tokens > first_prompt
            chat.new_button.click()
            assert chat.messages == [] and chat.transcript.toPlainText() == ""

    run(body())


def test_stop_cancels_the_request_on_the_node(qtbot, run, data_dir, long_model, capsys):
    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))

    async def body():
        async with running_app(node_config(data_dir, long_model)) as app:
            chat = app.window.chat_tab
            await wait_until(lambda: chat.send_button.isEnabled(), DEADLINE_S, what="the chat ready")
            timer.start()
            task = chat.send("def hello(")
            def streamed() -> int:
                running = app.node.traces.in_flight_traces()
                return running[0].completion_tokens if running else 0
            await wait_until(lambda: streamed() >= 60, DEADLINE_S, what="part of the reply")  # of 256
            assert app.node.traces.in_flight == 1
            chat.stop_button.click()
            await wait_until(lambda: app.node.traces.in_flight == 0, DEADLINE_S, what="the request cancelled")
            timer.stop()
            assert task.cancelled()
            trace = app.node.traces.recent[-1]
            assert trace.outcome == "cancelled" and 0 < trace.completion_tokens < 256
            assert chat.transcript.toPlainText().endswith("[stopped]")
            assert chat.messages[-1]["role"] == "assistant"  # as far as it got
            assert chat.send_button.isEnabled() and not chat.stop_button.isEnabled()

    run(body())
    gaps = sorted((b - a) * 1000 for a, b in zip(ticks, ticks[1:], strict=False))
    assert len(gaps) >= 10, "the Qt loop barely turned while the chat streamed"
    with capsys.disabled():
        print(f"\nevent-loop latency while the chat tab streamed: 10 ms timer, {len(gaps) + 1} ticks, "
              f"gap p50={statistics.median(gaps):.1f} ms p99={gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]:.1f} ms "
              f"max={gaps[-1]:.1f} ms")


def test_download_progress_through_pause_and_resume(qtbot, run, data_dir, tiny_model, tmp_path):
    other = tmp_path / "resumed.gguf"
    write_gguf(other, dataclasses.replace(TINY, seed=12, name="resumed", vocab=4096))
    data = other.read_bytes()
    cut = len(data) // 3
    stall = asyncio.Event()
    ranges: list[str | None] = []

    async def serve(request):
        ranges.append(request.headers.get("Range"))
        if request.headers.get("Range"):  # the resume: the rest, if the version still matches
            assert request.headers.get("If-Range") == '"v1"'
            first = int(request.headers["Range"].removeprefix("bytes=").rstrip("-"))
            return web.Response(status=206, body=data[first:], headers={
                "ETag": '"v1"', "Content-Range": f"bytes {first}-{len(data) - 1}/{len(data)}"})
        resp = web.StreamResponse(headers={"ETag": '"v1"'})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[:cut])
        await stall.wait()  # then nothing: the user pauses
        return resp

    async def body():
        async with http_file("/resumed.gguf", serve) as url:
            try:
                async with running_app(node_config(data_dir, tiny_model)) as app:
                    tab = app.window.models_tab
                    tab.download_url(url)
                    await wait_until(lambda: "file:resumed.gguf" in tab.downloads.rows and
                                     tab.downloads.rows["file:resumed.gguf"].bar.value() >= 300, DEADLINE_S,
                                     what="a third downloaded")
                    row = tab.downloads.rows["file:resumed.gguf"]
                    assert " of " in row.detail.text() and row.pause_button.text() == "Pause", (ranges, row.detail.text())
                    row.pause_button.click()
                    await wait_until(lambda: row.pause_button.text() == "Resume", DEADLINE_S, what="paused")
                    assert row.detail.text().startswith("paused")
                    assert (app.node.data_dir / "models" / "resumed.gguf.part").stat().st_size == cut
                    row.pause_button.click()
                    await wait_until(lambda: row.detail.text().startswith("done"), DEADLINE_S, what="the resume")
                    assert row.bar.value() == 1000 and row.bar.format() == "100%"
                    assert ranges == [None, f"bytes={cut}-"]  # the resume asked for the rest only
                    assert (app.node.data_dir / "models" / "resumed.gguf").read_bytes() == data
                    assert any(e.name == "resumed" for e in app.node.catalog.entries.values())
            finally:
                stall.set()

    run(body())


def test_download_of_a_hugging_face_repo_and_quant(qtbot, run, data_dir, tiny_model, tmp_path, monkeypatch):
    """Download… takes `hf://owner/repo:QUANT` (2026-12-06): looked up on the Hub (its stand-in here),
    then downloaded as the file it names; a quant the repo lacks says what it has."""
    from tests.support.hubserver import HubServer, serving_hub

    data = tiny_model.read_bytes()

    async def body():
        hub = HubServer(data, "/org/Tiny-GGUF/resolve/main/Tiny-Q8_0.gguf")
        hub.add_file("/org/Tiny-GGUF/resolve/main/Tiny-Q4_K_M.gguf", data + b"\0" * 64)
        async with serving_hub(hub, monkeypatch, tmp_path):
            async with running_app(node_config(data_dir, tiny_model)) as app:
                tab = app.window.models_tab
                tab.download_url("hf://org/Tiny-GGUF:Q5_K_S")
                await wait_until(lambda: "has no Q5_K_S file" in tab.status.full_text, DEADLINE_S, what="the refusal")
                assert "Tiny-Q4_K_M.gguf" in tab.status.full_text
                tab.download_url("hf://org/Tiny-GGUF:q8_0")
                await wait_until(lambda: tab.status.full_text.startswith("downloaded Tiny-Q8_0.gguf"), DEADLINE_S,
                                 what="the download")
                assert (app.node.data_dir / "models" / "Tiny-Q8_0.gguf").read_bytes() == data

    run(body())
