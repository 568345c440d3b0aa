"""The Swarm tab sizes the selected model's layers (the "≈ N of M layers" beside the memory slider)
once its panel is seen. Sizing imports torch (1.5 s, ~180 MB): until 2026-12-07 every start of the
tray app did it for the first model, its window closed, so the app's node always held torch though it
served whole models through llama.cpp (measured: 428 MB RSS; a node that never sizes: 128 MB)."""

from __future__ import annotations

import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


@pytest.mark.llama
def test_the_selected_model_is_sized_once_the_swarm_tab_is_seen(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            app.window.show_tab("Overview")
            panel = app.window.swarm_tab.contribute
            model_id = app.node.models.all()[0].id
            await wait_until(lambda: panel.model_id == model_id, DEADLINE_S, what="the model selected in the panel")
            panel.refresh()  # (as any event does)
            assert panel.cost == {}, panel.cost  # not seen: not sized
            app.window.bring_up()
            app.window.show_tab("Swarm")
            await wait_until(lambda: panel.cost.get(model_id), DEADLINE_S, what="the model sized")
            assert " layers (" in panel.budget_label.text(), panel.budget_label.text()

    run(body())
