"""A `--layers` slice whose layers could not be fetched is loaded again in the background; the app
keeps its failure shown through each retry (2026-12-07).

Seen: each retry registered a new slice "loading": the app's state went to "loading" (the
first-run banner hidden) until the retry failed and "error" came back, every 5 s, 10 s, 20 s … a
flicker between two failures. A slice loading again after a failed load now counts as failed until
it loads, and the banner names the failure with "(retrying…)".
"""

from __future__ import annotations

import logging

import pytest

from app.host import AppState
from node import const
from node.inference.synth import SynthSpec, write_gguf
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128, name="later")


def test_a_layers_retry_keeps_the_failure_shown(qtbot, run, data_dir, tmp_path, monkeypatch, caplog):
    for name, value in (("DOWNLOAD_RETRY_BASE_S", 0.01), ("DOWNLOAD_RETRIES", 2), ("PARTIAL_OPEN_RETRY_MIN_S", 0.2),
                        ("PARTIAL_OPEN_RETRY_MAX_S", 0.4)):
        monkeypatch.setattr(const, name, value)
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    data = write_gguf(tmp_path / "later.gguf", SPEC).read_bytes()

    async def body():
        with ThreadedOrigin(data, "later.gguf") as origin:
            origin.fail_from = 65536  # the header comes; the layers' ranges get a 503
            config = node_config(data_dir, models=[origin.url], layers="1-2", slice_dtype="f32", slice_kv_dtype="f32")
            async with running_app(config) as tray_app:
                host = tray_app.host
                slice_host = host.node.slice_host
                await wait_until(lambda: host.state == AppState.ERROR, DEADLINE_S,
                                 what=f"the failed --layers slice to show (the app says {host.state})")
                seen: list[tuple[str, str, str | None]] = []  # (slice state, app state, banner text) at each event

                def on_slice(hosted) -> None:  # (after NodeHost's own observer: it subscribed first)
                    seen.append((hosted.state, host.state, host.first_run_text()))

                states: list[str] = []
                host.state_changed.connect(states.append)
                unsubscribe = slice_host.subscribe(on_slice)
                try:
                    def retried() -> bool:
                        return sum("failed at start again" in r.getMessage() for r in caplog.records) >= 2 \
                            and [s for s, *_ in seen].count("failed") >= 2
                    await wait_until(retried, DEADLINE_S, what="two background retries, each failing")
                finally:
                    unsubscribe()
                    host.state_changed.disconnect(states.append)
                loading = [(app, text) for state, app, text in seen if state == "loading"]
                assert loading, seen
                assert all(app == AppState.ERROR for app, _ in loading), seen
                assert all(text and "(retrying…)" in text for _, text in loading), seen
                assert AppState.LOADING.value not in states, states
                banner = tray_app.window.overview_tab.banner
                assert banner.isVisible() and "failed to load" in banner.text.text()
                origin.fail_from = None  # the origin is back: the retry loads and the app serves
                await wait_until(lambda: host.state == AppState.SERVING, DEADLINE_S,
                                 what=f"the app to serve once the layers arrived (it says {host.state})")
                assert host.first_run_text() is None

    run(body())
