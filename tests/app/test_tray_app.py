"""The tray app hosting a real node: requests show up live, copy actions, load/unload, quit."""

from __future__ import annotations

import asyncio
import dataclasses
import tomllib

import openai
import pytest
from aiohttp import web
from PySide6.QtGui import QGuiApplication

from app.host import AppState
from app.ui import fmt
from node.inference.synth import write_gguf
from tests.app.helpers import DEADLINE_S, http_file, running_app
from tests.support.nodes import TINY, node_config
from tests.support.ports import port_is_free
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_request_through_the_api_appears_in_the_requests_table(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            assert app.host.state == AppState.SERVING
            node = app.node
            model = app.feeds.requests
            client = openai.AsyncOpenAI(base_url=node.api_url, api_key=node.api_key, max_retries=0)
            try:
                reply = await client.chat.completions.with_raw_response.create(
                    model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
            finally:
                await client.close()
            request_id = reply.headers["x-request-id"]
            # (a reply max_tokens cut says so beside "ok")
            outcome = "ok" if reply.parse().choices[0].finish_reason == "stop" else "ok · cut at max tokens"
            await wait_until(lambda: model.cell_text(request_id, "Outcome") == outcome,
                             DEADLINE_S, what="the finished row")
            assert model.cell_text(request_id, "Route") == reply.headers["x-swarm-route"] == "local"
            ttft = model.cell_text(request_id, "TTFT")
            assert ttft != fmt.DASH and ttft.endswith(" ms")
            assert model.cell_text(request_id, "Nodes") == node.short_id
            assert model.cell_text(request_id, "Model").startswith("tiny-")
            # Selecting the row shows its segments and the node's own summary line.
            tab = app.window.requests_tab
            tab.select(request_id)
            trace = model.trace(request_id)
            assert tab.summary.toPlainText() == trace.summary_line()
            assert "DIAG: request complete" in tab.summary.toPlainText()
            assert tab.segments.rowCount() == 1
            assert tab.segments.cell_text(0, "Node") == node.short_id
            assert app.feeds.overview.text("Requests/min") == "1"

    run(body())


def test_copy_diagnostics_is_redacted_and_full_report_is_not(qtbot, run, data_dir, tiny_model):
    private_ip, public_ip = "192.168.77.23", "93.184.216.34"

    async def body():
        async with running_app(node_config(data_dir, tiny_model), tray_available=True) as app:
            node = app.node
            node.note_activity(f"peer dialled at {private_ip}:8810 via relay {public_ip}:8810")
            clipboard = QGuiApplication.clipboard()
            clipboard.setText("")
            app.tray.copy_diagnostics_action.trigger()
            await wait_until(lambda: "SwarmLLM diagnostics" in clipboard.text(),
                             DEADLINE_S, what="the report on the clipboard")
            text = clipboard.text()
            assert private_ip not in text and public_ip not in text
            assert "<private-ip-" in text and "<public-ip-" in text and ":8810" in text
            assert node.api_key not in text
            assert str(data_dir) not in text
            assert "-- recent activity --" in text and "redacted: yes" in text
            # The diagnostics tab shows the same redacted report and can copy the private one.
            tab = app.window.diagnostics_tab
            shown = await tab.async_refresh()
            assert private_ip not in shown and node.api_key not in shown
            clipboard.setText("")
            tab.copy_full_button.click()
            await wait_until(lambda: private_ip in clipboard.text(),
                             DEADLINE_S, what="the full report on the clipboard")
            assert node.api_key not in clipboard.text()  # never, even in the full report

    run(body())


def test_copy_api_url_and_key(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model), tray_available=True) as app:
            clipboard = QGuiApplication.clipboard()
            app.tray.copy_url_action.trigger()
            assert clipboard.text() == app.node.api_url
            assert clipboard.text().startswith("http://localhost:")
            app.tray.copy_key_action.trigger()
            assert clipboard.text() == app.node.api_key

    run(body())


def test_unload_and_load_change_the_models_table(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            tab = app.window.models_tab
            model_id = app.node.models.all()[0].id
            table = app.feeds.models
            assert table.cell_text(model_id, "State") == "loaded"
            assert table.cell_text(model_id, "Device") == "CPU"
            assert table.cell_text(model_id, "Placement reason") != fmt.DASH
            tab.select(model_id)
            assert tab.unload_button.isEnabled() and not tab.load_button.isEnabled()
            tab.unload_button.click()
            await wait_until(lambda: table.cell_text(model_id, "State") == "unloaded",
                             DEADLINE_S, what="the unloaded row")
            # still serving: a request loads it again (the tray said "no model can serve" and showed
            # the first-run banner, while the API answered every request)
            assert app.host.state == AppState.SERVING
            assert "loads on the first request" in app.host.status_line()
            assert not app.window.overview_tab.banner.isVisibleTo(app.window)
            assert tab.load_button.isEnabled()
            tab.load_button.click()
            await wait_until(lambda: table.cell_text(model_id, "State") == "loaded",
                             DEADLINE_S, what="the loaded row")
            assert app.host.state == AppState.SERVING
            assert table.cell_text(model_id, "Memory").startswith("≈")

    run(body())


def test_quit_from_the_tray_menu_frees_the_port(qtbot, run, data_dir, tiny_model):
    async def body():
        from app.tray_app import TrayApp

        app = TrayApp(node_config(data_dir, tiny_model), tray_available=True)
        task = asyncio.ensure_future(app.async_run())
        await wait_until(lambda: app.host.state == AppState.SERVING, DEADLINE_S, what="serving")
        port = app.node.api.port
        assert not port_is_free(port)
        app.window.close()  # with a tray, closing the window keeps the app running
        await asyncio.sleep(0)
        assert not task.done() and app.host.state == AppState.SERVING
        app.tray.quit_action.trigger()
        assert await asyncio.wait_for(task, 60) == 0
        assert port_is_free(port)
        assert app.node.traces.in_flight == 0
        assert all(m.engine is None for m in app.node.models.all())

    run(body())


def test_pause_contributing(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model), tray_available=True) as app:
            assert app.node.config.contribute
            app.tray.pause_action.trigger()
            await wait_until(lambda: app.host.state == AppState.PAUSED, DEADLINE_S, what="the pause")
            assert not app.node.config.contribute
            assert app.feeds.overview.text("Contributing") == "paused"
            assert app.tray.pause_action.isChecked()
            kept = tomllib.loads((data_dir / "config.toml").read_text())
            assert kept["desktop"]["contribute"] is False  # the next start stays paused
            assert "api" in kept  # the rest of the file is as it was
            app.tray.pause_action.trigger()
            await wait_until(lambda: app.host.state == AppState.SERVING, DEADLINE_S, what="the resume")
            assert app.node.config.contribute and not app.tray.pause_action.isChecked()
            assert tomllib.loads((data_dir / "config.toml").read_text())["desktop"]["contribute"] is True

    run(body())


def test_first_run_without_a_model_says_so_and_opens_the_window(qtbot, run, data_dir):
    async def body():
        async with running_app(node_config(data_dir), tray_available=True) as app:
            assert app.host.state == AppState.NO_MODEL
            assert app.window.isVisible()  # opened although the tray exists: nothing can serve
            banner = app.window.overview_tab.banner
            assert banner.isVisible()
            assert "No model can serve requests yet" in banner.title.text()
            assert "--model" in banner.text.text() and "models" in banner.text.text()

    run(body())


def test_add_model_file_from_the_first_run_state(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir)) as app:
            assert app.host.state == AppState.NO_MODEL
            app.window.models_tab.add_model_file(tiny_model)
            await wait_until(lambda: app.host.state == AppState.SERVING,
                             DEADLINE_S, what="the added model to serve")
            assert not app.window.overview_tab.banner.isVisible()
            assert app.feeds.models.rowCount() == 1

    run(body())


def test_add_model_file_of_a_split_model_says_to_keep_all_its_parts(qtbot, run, data_dir, tiny_model, tmp_path):
    # until 2026-12-06 it said "copy the file into models/": part 1 alone there is refused
    from tests.node.test_model_file_kinds import rewrite

    rewrite(tiny_model, tmp_path / "big.gguf", split_max_tensors=8)

    async def body():
        async with running_app(node_config(data_dir)) as app:
            tab = app.window.models_tab
            tab.add_model_file(tmp_path / "big-00001-of-00003.gguf")
            await wait_until(lambda: "added for this session" in tab.status.full_text, DEADLINE_S,
                             what="the added split model")
            assert "copy its 3 parts (big-00001-of-00003.gguf …) into" in tab.status.full_text, tab.status.full_text

    run(body())


def test_without_a_system_tray_the_window_is_the_app(qtbot, run, data_dir, tiny_model):
    async def body():
        from app.tray_app import TrayApp

        app = TrayApp(node_config(data_dir, tiny_model), tray_available=False)
        task = asyncio.ensure_future(app.async_run())
        await wait_until(lambda: app.host.state == AppState.SERVING, DEADLINE_S, what="serving")
        assert app.window.isVisible()
        port = app.node.api.port
        app.window.close()  # no tray: closing the window quits
        assert await asyncio.wait_for(task, 60) == 0
        assert port_is_free(port)

    run(body())


def test_port_in_use_is_an_error_state_with_the_reason(qtbot, run, data_dir, tmp_path, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as first:
            port = first.node.api.port
            other = tmp_path / "other"
            other.mkdir()
            async with running_app(node_config(other, tiny_model, port=port)) as second:
                assert second.host.state == AppState.ERROR
                assert f"port {port} is already in use" in second.host.first_run_text()
                assert second.window.isVisible()
            assert first.host.state == AppState.SERVING  # the failed second app did not disturb it

    run(body())


def test_copy_diagnostics_of_a_node_that_could_not_start_says_why_redacted(qtbot, run, data_dir, tiny_model):
    """The report of a node that never started failed (no machine facts) and the button fell back
    to the raw status line, whose start error named the data dir's path (found by an audit,
    2026-12-06). Now the report is built, led by the reason, redacted like any other."""
    (data_dir / "api_key").mkdir(parents=True)  # the node cannot read its key: it cannot start

    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            assert app.host.state == AppState.ERROR and str(data_dir) in app.host.status_line()
            report = await app.actions.async_copy_diagnostics()
            assert report.startswith("SwarmLLM — could not start:") and "<path>" in report.splitlines()[0]
            assert "-- this machine --" in report and "cpu: " in report
            # (the folder's own name is "data", which the advice's `--data-dir` holds: its unique parent's)
            assert str(data_dir) not in report and data_dir.parent.name not in report
            full = await app.actions.async_report(full=True)
            assert str(data_dir) in full.splitlines()[0]  # the private report keeps it

    run(body())


def test_download_from_the_models_tab_adds_a_loadable_model(qtbot, run, data_dir, tiny_model, tmp_path):
    """The Download… action, against a local HTTP server: progress in the status line, the model
    appears in the table, selected, and Load serves it."""
    other = tmp_path / "other.gguf"
    write_gguf(other, dataclasses.replace(TINY, seed=11, name="fetched"))

    async def serve(request):
        return web.FileResponse(other)

    async def body():
        async with http_file("/fetched.gguf", serve) as url:
            async with running_app(node_config(data_dir, tiny_model)) as app:
                tab = app.window.models_tab
                seen: list[str] = []  # what the status line showed as the download ran
                app.node.downloads.subscribe(lambda job: seen.append(tab.status.full_text))
                tab.download_url(url)
                await wait_until(lambda: tab.status.full_text.startswith("downloaded fetched.gguf"),
                                 DEADLINE_S, what="the download")
                model_id = tab.selected_id()
                assert model_id is not None and model_id.startswith("fetched-")
                # what a load takes follows the line (it replaced it: found in CI, 2026-12-06)
                await wait_until(lambda: " takes ≈" in tab.status.full_text, DEADLINE_S, what="the fit text")
                assert tab.status.full_text.startswith("downloaded fetched.gguf"), tab.status.full_text
                assert app.feeds.models.summary(model_id)["state"] == "unloaded"
                assert any(text.startswith("downloading fetched.gguf: ") and f" of {fmt.size(other.stat().st_size)} (" in text for text in seen), seen
                assert tab.load_button.isEnabled()
                tab.load_selected()
                await wait_until(lambda: app.feeds.models.summary(model_id)["state"] == "loaded",
                                 DEADLINE_S, what="the model loaded")
                tab.download_url("ftp://nope/x.gguf")
                assert "http(s)" in tab.status.full_text

    run(body())


def test_a_download_can_be_cancelled_from_the_models_tab(qtbot, run, data_dir, tiny_model, tmp_path):
    release = asyncio.Event()

    async def stall(request):  # a few bytes of a GGUF, then nothing until the test ends
        resp = web.StreamResponse()
        resp.content_length = 10_000_000
        await resp.prepare(request)
        await resp.write(b"GGUF" + b"\0" * 60_000)
        await release.wait()
        return resp

    async def body():
        async with http_file("/slow.gguf", stall) as url:
            try:
                async with running_app(node_config(data_dir, tiny_model)) as app:
                    tab = app.window.models_tab
                    assert tab.downloads.isHidden()
                    tab.download_url(url)
                    await wait_until(lambda: tab.status.full_text.startswith("downloading slow.gguf: "),
                                     DEADLINE_S, what="progress")
                    row = tab.downloads.rows["file:slow.gguf"]
                    assert not tab.downloads.isHidden() and not row.cancel_button.isHidden()
                    assert (app.node.data_dir / "models" / "slow.gguf.part").exists()
                    row.cancel_button.click()
                    await wait_until(lambda: "cancelled" in tab.status.full_text, DEADLINE_S, what="the cancel")
                    assert row.cancel_button.isHidden() and row.pause_button.isHidden()
                    assert row.detail.text().startswith("cancelled")
                    assert not list((app.node.data_dir / "models").glob("slow.gguf*"))
            finally:
                release.set()  # the server's handler returns before the server shuts down

    run(body())
