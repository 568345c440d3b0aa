"""The Overview stays readable in a window made as small as it goes: with the first-run banner
showing, its parts no longer draw over each other.

Seen (Xvfb, the window dragged to its minimum, 742×480, with "The node could not start: port 8800
is already in use …" wrapped on two lines): "Recent requests" was drawn over the summary's Peers
row and the Contributing row was cut under it — the window's minimum came from the banner's
one-line height, and Qt lays widgets over each other when they do not fit.
"""

from __future__ import annotations

import socket

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication

from app.host import AppState
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def _laid_out() -> None:
    """Run the pending layout passes now (only those: no timers or sockets, so no loop callbacks)."""
    for _ in range(3):
        QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)


def test_the_overview_parts_do_not_overlap_in_a_small_window(qtbot, run, data_dir, tiny_model):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()

    async def body():
        config = node_config(data_dir, tiny_model, port=taken.getsockname()[1], host="127.0.0.1")
        async with running_app(config, tray_available=False) as tray_app:
            assert tray_app.host.state == AppState.ERROR
            window, tab = tray_app.window, tray_app.window.overview_tab
            window.show_tab("Overview")
            window.resize(400, 300)  # smaller than it allows: it stops at its minimum
            _laid_out()
            parts = [tab.banner, tab.view, tab.recent_label, tab.recent, tab.hint]
            assert all(p.isVisible() for p in parts)
            names = ("banner", "summary", "label", "requests", "hint")
            spans = [(p.mapTo(window, p.rect().topLeft()).y(), p.mapTo(window, p.rect().bottomLeft()).y())
                     for p in parts]
            for i in range(len(parts) - 1):
                a_bottom, b_top = spans[i][1], spans[i + 1][0]
                assert a_bottom < b_top, f"{names[i]} (to y={a_bottom}) overlaps {names[i + 1]} (from y={b_top}): {spans}"
            rows = tab.view.model().rowCount()
            assert tab.view.height() >= rows * tab.view.verticalHeader().defaultSectionSize()

    try:
        run(body())
    finally:
        taken.close()
