"""The Models tab's status line in a window as narrow as it goes: one line under the buttons,
elided, the whole text in its tooltip.

Seen (the window at its minimum width, a download's or a fit's line): the word-wrapped label beside
Load / Unload / Add / Download wrapped into a tall column next to them, squeezing them.
"""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it

LONG = ("downloading a-model-with-a-rather-long-file-name-Q4_K_M-00001-of-00003.gguf: 1234.5 / 5678.9 MB "
        "(22%, 12.3 MB/s) · Loading it takes ≈ 6.1 GiB, more than the 2.0 GiB of RAM free now: it may not fit")


def _laid_out() -> None:
    for _ in range(3):
        QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)


def test_a_long_status_stays_one_line_under_the_buttons_at_the_minimum_width(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model), tray_available=False) as tray_app:
            window, tab = tray_app.window, tray_app.window.models_tab
            await wait_until(lambda: tray_app.host.serving().whole_loaded, DEADLINE_S, what="the model to load")
            window.show_tab("Models")
            tab._report(LONG)
            window.resize(200, window.height())  # narrower than it allows: it stops at its minimum
            _laid_out()
            if os.environ.get("GUIFIX_SHOT"):  # (a look at it: GUIFIX_SHOT=/path/to.png)
                window.grab().save(os.environ["GUIFIX_SHOT"])
            assert window.width() < 900, window.width()
            buttons = [tab.load_button, tab.unload_button, tab.add_button, tab.download_button]
            for b in buttons:  # not squeezed
                assert b.width() >= b.sizeHint().width(), (b.text(), b.width(), b.sizeHint().width())
            line = tab.fontMetrics().lineSpacing()
            assert tab.status.height() < 2 * line, f"the status is {tab.status.height()} px high: wrapped"
            status_top = tab.status.mapTo(window, tab.status.rect().topLeft()).y()
            assert all(status_top >= b.mapTo(window, b.rect().bottomLeft()).y() or
                       tab.status.mapTo(window, tab.status.rect().topLeft()).x() >=
                       b.mapTo(window, b.rect().topRight()).x() for b in buttons)  # over none of them
            assert tab.status.toolTip() == LONG
            assert tab.status.full_text == LONG and tab.status.text().endswith("…")

    run(body())
