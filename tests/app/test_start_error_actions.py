"""A node that could not start offers no model actions that cannot work: "Add model file…" in its
banner loaded the file into memory (llama.cpp) and said "added for this session" while no API
served it (seen with a second copy of the app: the model loaded, the state stayed "error")."""

from __future__ import annotations

import asyncio

import pytest
from PySide6.QtWidgets import QPushButton

from app.host import AppState
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = pytest.mark.gui


def test_add_model_file_in_a_node_that_could_not_start_loads_nothing(qtbot, run, data_dir, tmp_path, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as first:
            other = tmp_path / "other"
            other.mkdir()
            async with running_app(node_config(other, port=first.node.api.port)) as second:
                assert second.host.state == AppState.ERROR
                banner = second.window.overview_tab.banner
                assert banner.isVisible()
                add = next(b for b in banner.findChildren(QPushButton) if b.text() == "Add model file…")
                assert not add.isVisibleTo(banner), "the banner offers Add model file…"
                tab = second.window.models_tab
                tab.add_model_file(tiny_model)  # as the Models tab's own button does
                await asyncio.sleep(2.0)
                assert [m.state for m in second.node.models.all()] == [], "a model was loaded into a node that is not running"
                assert "not running" in tab.status.full_text, tab.status.full_text

    run(body())
