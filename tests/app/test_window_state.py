"""The window comes back as it was left (size, tab, appearance), Alt+N switches tabs, and the dark
palette really is dark."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = [pytest.mark.gui]


@pytest.mark.blocks_loop("switching the palette restyles every widget on the GUI thread, which is the loop's "
                         "(0.2-0.4 s, once per click of Appearance)")
def test_size_tab_and_appearance_are_restored(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            window = app.window
            assert (window.width(), window.height()) == (1120, 720)  # the default the first time
            window.resize(780, 560)  # (within the offscreen screen, 800x600: a restore clamps to it)
            window.show_tab("Swarm")
            window.appearance_actions["dark"].trigger()
            assert QApplication.instance().palette().color(QPalette.ColorRole.Window).lightness() < 80
            window.save_state()
        async with running_app(node_config(data_dir, tiny_model)) as app:
            window = app.window
            assert (window.width(), window.height()) == (780, 560)
            assert window.tabs.tabText(window.tabs.currentIndex()) == "Swarm"
            assert window.appearance_actions["dark"].isChecked()
            window.appearance_actions["light"].trigger()
            assert QApplication.instance().palette().color(QPalette.ColorRole.Window).lightness() > 180
            window.appearance_actions["system"].trigger()
            assert (data_dir / "window.ini").is_file()

    run(body())
