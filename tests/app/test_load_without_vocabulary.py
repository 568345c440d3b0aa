"""A GGUF without tokenizer data (no `tokenizer.ggml.tokens`) is registered with its failure, and the
node refuses every load of it (`model_load_failed`: no load can succeed without a vocabulary). Until
2026-12-07 the Models tab's Load button was enabled for it all the same (its state is "failed", which
Load retries), and its State tooltip said "press Load to try again". Load is now disabled for it, its
tooltip saying why, as the admin API's `no_vocabulary` says."""

from __future__ import annotations

import json

import aiohttp
import pytest
from PySide6.QtCore import Qt

from tests.app.helpers import DEADLINE_S, running_app
from tests.node.test_model_load_failed import without_tensor
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


async def admin(app, method: str, path: str) -> tuple[int, dict]:
    node = app.host.node
    async with aiohttp.ClientSession() as s, s.request(method, f"http://127.0.0.1:{node.api.port}{path}",
                                                       headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, json.loads(await r.text())


def test_load_is_disabled_for_a_model_without_vocabulary(qtbot, run, data_dir, tiny_model, tmp_path):
    novocab = without_tensor(tiny_model, tmp_path / "novocab.gguf", "", drop_key="tokenizer.ggml.tokens")

    async def body():
        async with running_app(node_config(data_dir, tiny_model, novocab)) as app:
            tab, rows = app.window.models_tab, app.feeds.models

            def row_named(name: str) -> str | None:
                return next((k for k in rows.keys() if k.startswith(name + "-")), None)
            await wait_until(lambda: row_named("novocab") and row_named("tiny")
                             and rows.summary(row_named("tiny"))["state"] == "loaded", DEADLINE_S, what="both rows")
            bad, good = row_named("novocab"), row_named("tiny")
            assert rows.summary(bad)["state"] == "failed"
            status, listed = await admin(app, "GET", "/api/admin/models")
            assert {m["id"]: m["no_vocabulary"] for m in listed["models"]} == {bad: True, good: False}
            status, refused = await admin(app, "POST", f"/api/admin/models/{bad}/load")
            assert status == 500 and "vocabulary" in refused["error"]["message"], refused  # the node refuses it

            tab.view.clearSelection()
            tab.select(bad)
            assert tab.selected_id() == bad
            assert not tab.load_button.isEnabled()
            assert "vocabulary" in tab.load_button.toolTip(), tab.load_button.toolTip()
            state_col = [c.title for c in rows.columns].index("State")
            tip = rows.data(rows.index(rows.row_of(bad), state_col), Qt.ItemDataRole.ToolTipRole)
            assert "vocabulary" in tip and "press Load" not in tip, tip

            await app.host.async_unload(good)  # a model a load applies to: Load enabled, no such tooltip
            await wait_until(lambda: rows.summary(good)["state"] == "unloaded", DEADLINE_S, what="unloaded")
            tab.view.clearSelection()
            tab.select(good)
            assert tab.load_button.isEnabled() and tab.load_button.toolTip() == ""

    run(body())
