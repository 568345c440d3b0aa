"""The automatic layer choice's failed load is told where a user looks (2026-12-07).

Seen: a slice chosen by `--serve auto` (or the Swarm tab's "Help serve") that failed to load (here
a GGUF whose header claims a layer it has no tensors for; a truncated download, no memory and a
fetch that fails end the same way) was unloaded at once and chosen again later: the app went back
to "no model can serve" with the first-run banner saying nothing of it, the Swarm tab's line said
"choosing where the swarm needs them…", and neither the diagnostics report nor
/api/admin/contribute named it. The last failure (model, layers, reason, when, next choice) is now
kept until a later choice loads, and shown in all of them, with a DIAG line at the failure.
"""

from __future__ import annotations

import logging

import pytest

from app.host import AppState
from tests.app.helpers import DEADLINE_S, running_app
from tests.app.test_slice_load_failed import wrong_layer_count
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def test_a_failed_automatic_choice_is_shown_in_the_banner_swarm_tab_diagnostics_and_admin_api(
        qtbot, run, data_dir, tmp_path, caplog):
    model = wrong_layer_count(tmp_path / "wrongcount.gguf")
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.autoserve")

    async def body():
        async with running_app(node_config(data_dir, model, serve="auto")) as tray_app:
            host = tray_app.host
            node = host.node
            await wait_until(lambda: node.autoserve.failures(), DEADLINE_S, what="the automatic choice to fail")
            failure = node.autoserve.failures()[0]
            assert failure.model == node.catalog.resolve("wrongcount").id
            assert failure.retry_at >= failure.at and failure.reason
            said = [r.getMessage() for r in caplog.records if "slice load failed, choosing again soon" in r.getMessage()]
            assert said and f"layers={failure.start}-{failure.end - 1}" in said[0] and "reason=" in said[0], said
            # the failed slice is gone from the slice host; the app says why nothing serves
            await wait_until(lambda: host.state == AppState.ERROR, DEADLINE_S,
                             what=f"the app's state to say the failure (it says {host.state})")
            banner = tray_app.window.overview_tab.banner
            await wait_until(lambda: banner.isVisible() and "(chosen automatically) failed to load" in banner.text.text(),
                             DEADLINE_S, what="the first-run banner to name the failed choice")
            assert failure.reason[:40] in banner.text.text(), banner.text.text()
            assert "chosen again at" in banner.text.text()
            report = await node.async_report()
            assert "failed: layers" in report and "(chosen automatically) failed to load" in report, report
            summary = node.contributions.summary()
            assert summary["failures"] and summary["failures"][0]["model"] == failure.model, summary
            assert summary["failures"][0]["layers"] == [failure.start, failure.end - 1]

            # the Swarm tab's "Help serve" line for the same model (its own budget: chosen again)
            panel = tray_app.window.swarm_tab.contribute
            await host.async_help_serve(failure.model, 0)
            panel.set_model(failure.model)
            await wait_until(lambda: (panel.refresh() or "failed to load" in panel.status.text()), DEADLINE_S,
                             what="the Swarm tab's contribution line to name the failure")
            assert "choosing again at" in panel.status.text(), panel.status.text()
            [row] = [m for m in node.contributions.summary()["models"] if m["model"] == failure.model]
            assert row["last_failure"] is not None and row["last_failure"]["reason"], row

    run(body())


def test_the_automatic_choices_retry_keeps_its_failure_shown(qtbot, run, data_dir, tmp_path, monkeypatch, caplog):
    """Each retry of the choice loaded a slice "loading": the app said "loading a model" (banner
    hidden) between two failures. A load retrying a failed one now keeps the failure shown."""
    from node import const

    monkeypatch.setattr(const, "AUTO_SERVE_RETRY_MIN_S", 0.2)
    model = wrong_layer_count(tmp_path / "wrongcount.gguf")
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.autoserve")

    async def body():
        async with running_app(node_config(data_dir, model, serve="auto")) as tray_app:
            host = tray_app.host
            await wait_until(lambda: host.node.autoserve.failures() and host.state == AppState.ERROR, DEADLINE_S,
                             what="the automatic choice to fail")
            seen: list[tuple[str, str, str | None]] = []  # (slice state, app state, banner text) at each event
            unsubscribe = host.node.slice_host.subscribe(
                lambda hosted: seen.append((hosted.state, host.state, host.first_run_text())))
            try:
                await wait_until(lambda: [s for s, *_ in seen].count("failed") >= 2, DEADLINE_S,
                                 what="two retries of the choice, each failing")
            finally:
                unsubscribe()
            loading = [(app, text) for state, app, text in seen if state == "loading"]
            assert loading, seen
            assert all(app == AppState.ERROR for app, _ in loading), seen
            assert all(text and "(chosen automatically) failed to load" in text and "retrying…" in text
                       for _, text in loading), seen

    run(body())


def test_the_app_says_a_failed_choices_next_time_in_local_time(monkeypatch):
    """Review r74: the tray's status said "chosen again at 20:19:41Z" (UTC, as node.log) while the Swarm
    tab said "choosing again at 21:19:41" for the same failure; the app says local time throughout."""
    import time
    from types import SimpleNamespace

    from app.serving import serving_of
    from node.inference.pipeline.budgets import ChoiceFailure

    monkeypatch.setenv("TZ", "Asia/Kathmandu")
    time.tzset()
    try:
        failure = ChoiceFailure("m", 0, 2, "why", 1_000_000_000.0, 1_000_003_600.0, 1)
        node = SimpleNamespace(autoserve=SimpleNamespace(failures=lambda: [failure]), pipeline=None,
                               models=SimpleNamespace(whole_models=list), slice_host=SimpleNamespace(slices={}))
        serving = serving_of(node)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert serving.choice_failed == ("layers 0–1 of m (chosen automatically) failed to load: why; "
                                     "chosen again at 08:31:40",)  # 02:46:40Z, +05:45 there
    assert failure.text().endswith("chosen again at 2001-09-09 02:46Z")  # (node.log's and the report's)
