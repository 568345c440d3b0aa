"""The Models tab's first row is selected as the app starts, while its model is still registered
and not loaded: the line under the buttons then said what a load takes ("Loading tiny-… takes ≈
32.6 MiB; 21.5 GiB of RAM is free.") and kept saying it once the model had loaded by itself (seen
under Xvfb with the embedded default model): under a loaded model, a line that reads as a load
under way. A fit line is now cleared when the selected model is no longer one a load applies to."""

from __future__ import annotations

import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


def test_no_fit_line_under_a_model_that_loaded(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            tab = app.window.models_tab
            await wait_until(lambda: tab.selected_id() is not None
                             and app.feeds.models.summary(tab.selected_id())["state"] == "loaded",
                             DEADLINE_S, what="the model selected and loaded")
            model_id = tab.selected_id()
            app.window.show_tab("Models")
            assert "takes ≈" not in tab.status.full_text, tab.status.full_text
            await app.host.async_unload(model_id)
            await wait_until(lambda: app.feeds.models.summary(model_id)["state"] == "unloaded", DEADLINE_S,
                             what="unloaded")
            tab.view.clearSelection()
            tab.select(model_id)  # an unloaded model selected: what a load takes is said
            await wait_until(lambda: "takes ≈" in tab.status.full_text, DEADLINE_S, what="the fit line")

    run(body())
