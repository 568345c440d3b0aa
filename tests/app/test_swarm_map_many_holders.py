"""A model held by many nodes must not make the window taller than the screen.

The layer map draws one row per holder and its minimum height was all of them: with 10 holders
(9 peers and one more, each holding 4 layers of a 16-layer model: seen live) the window could no
longer be made shorter than 720 px, and with 24 holders it needed over 1 000 px, so on a laptop
screen the Contribute panel and the status bar were off the bottom with no way to reach them.
The map now scrolls. The app runs with its real node; the holders are given to the Swarm tab's
model as the node's peer adverts would build them (24 real peers are more than a test can run).
"""

from __future__ import annotations

import asyncio

import pytest

from app.ui.swarm_model import Holder, ModelMap
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = [pytest.mark.gui]

SCREEN_H = 768  # a common laptop screen


def _map(n_holders: int) -> ModelMap:
    m = ModelMap("ab" * 32, "many-holders", "many-holders-abababab", 16)
    m.holders = [Holder(f"{i:08x}" + "0" * 56, (2 * i) % 12, (2 * i) % 12 + 4, 16) for i in range(n_holders)]
    m.counts = [sum(1 for h in m.holders if h.start <= layer < h.end) for layer in range(16)]
    return m


def test_many_holders_leave_the_window_shorter_than_a_laptop_screen(qtbot, run, tmp_path):
    async def body():
        async with running_app(node_config(tmp_path / "a")) as app:
            window = app.window
            window.show_tab("Swarm")
            few = window.minimumSizeHint().height()
            app.feeds.layer_map.set_maps([_map(24)])
            tab = window.swarm_tab
            tab.picker.setCurrentIndex(tab.picker.findData("ab" * 32))
            assert len(tab.map_view.map.holders) == 24
            await asyncio.sleep(0.3)  # the layout request is handled on the loop
            many = window.minimumSizeHint().height()
            assert many < SCREEN_H - 80, (
                f"24 holders make the window at least {many} px tall (with none: {few} px): "
                f"taller than a {SCREEN_H} px screen")
            window.resize(1000, 560)  # the user makes it short: the controls below the map stay in it
            await asyncio.sleep(0.3)
            assert window.height() <= 600, f"asked for 560 px, the window is {window.height()} px tall"
            panel = tab.contribute
            bottom = panel.mapTo(window, panel.rect().bottomLeft()).y()
            assert bottom <= window.height(), f"the Contribute panel ends at {bottom}, below the window"

    run(body())
