"""The Swarm tab's memory slider: a budget the user sets is applied even when a node event arrives
before the slider has rested (0.8 s).

Seen in the app: ticking "Help serve this model" at 256 MB, then moving the slider to its end
while the slice was loading: the slice's "loaded" event refreshed the panel within the 0.8 s,
which put the slider back at the node's old budget (256 MB), and the new budget was never applied
(the node kept 256 MB, the slider showed 256). During a fetch or with peers around, such events
come every few hundred ms, so most slider moves were lost.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_a_budget_moved_while_the_node_reports_events_is_applied(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            window = app.window
            window.show_tab("Swarm")
            panel = window.swarm_tab.contribute
            await wait_until(lambda: panel.help_box.isEnabled() and panel.cost.get(panel.model_id), DEADLINE_S,
                             what="the model's layer cost")
            contributions = app.node.contributions

            def budget() -> int | None:
                choice = next((m for m in contributions.summary()["models"] if m["model"] == panel.model_id), None)
                return choice["budget_mb"] if choice else None

            panel.slider.setValue(256)
            panel.help_box.click()
            await wait_until(lambda: budget() == 256, DEADLINE_S, what="helping at 256 MB")
            slider = panel.slider
            slider.setFocus()
            QTest.keyClick(slider, Qt.Key.Key_End)  # the user moves the budget to the most memory
            wanted = slider.value()
            assert wanted > 256
            # a node event within the 0.8 s the slider waits (a slice loaded, a fetch's progress,
            # a peer's advert all emit it)
            app.feeds.swarm_changed.emit()
            assert slider.value() == wanted, "the panel's refresh moved the slider the user had just set"
            await wait_until(lambda: budget() == wanted, DEADLINE_S, what=f"the node's budget to become {wanted} MB")
            assert slider.value() == wanted

    run(body())


def test_a_split_model_cannot_be_ticked_and_says_why(qtbot, run, data_dir, tiny_model, tmp_path):
    """A split model is served whole on this node only: "Help serve" stays off and the panel says so
    (until 2026-12-06 it could be ticked, and the node refused it with a warning in the log)."""
    from tests.node.test_model_file_kinds import rewrite

    rewrite(tiny_model, tmp_path / "big.gguf", split_max_tensors=8)
    part1 = tmp_path / "big-00001-of-00003.gguf"
    assert part1.exists()

    async def body():
        async with running_app(node_config(data_dir, part1)) as app:
            window = app.window
            window.show_tab("Swarm")
            panel = window.swarm_tab.contribute
            await wait_until(lambda: panel._known() and "split in 3 files" in panel.status.text(), DEADLINE_S,
                             what="the split model's explanation")
            assert not panel.help_box.isEnabled()
            assert panel.model_id not in panel.cost  # nothing asked the node for its layers' cost

    run(body())
