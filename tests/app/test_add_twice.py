"""A double-click on the Models tab's Add (or the same file chosen twice in a row): until 2026-12-07
both adds hashed the file and raced on its registration; the second said "added for this session"
too (or failed "not ready on this node yet" when it loaded). Now the adds of one path are one: a
single row, loaded, and the second add says the model is served already."""

from __future__ import annotations

import shutil

import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


def test_adding_the_same_file_twice_at_once_is_one_model(qtbot, run, data_dir, tiny_model, tmp_path):
    path = tmp_path / "twice.gguf"
    shutil.copyfile(tiny_model, path)

    async def body():
        async with running_app(node_config(data_dir)) as app:
            tab, rows = app.window.models_tab, app.feeds.models
            tab.add_model_file(path)
            tab.add_model_file(path)  # the second click, before the first add ended
            await wait_until(lambda: "served already" in tab.status.full_text, DEADLINE_S,
                             what="the second add's answer")
            assert rows.rowCount() == 1, rows.keys()
            model_id = rows.keys()[0]
            assert tab.status.full_text == f"{model_id} is served already (twice.gguf: the same model)"
            assert "Traceback" not in tab.status.full_text and "not ready" not in tab.status.full_text
            await wait_until(lambda: rows.summary(model_id)["state"] == "loaded", DEADLINE_S, what="loaded")
            assert [e.id for e in app.host.node.catalog.entries.values()] == [model_id]

    run(body())
