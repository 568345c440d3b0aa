"""The Qt binding must not drop a reference to None on every call (the tray app would abort).

PySide6/shiboken6 6.12.0 on Python 3.11 returns None from every void Qt method (QWidget.update,
QLabel.setText, QWidget.setAccessibleDescription, ...) without taking a reference to it, so each
call lowers None's refcount by one. A running tray app makes hundreds of such calls a second (the
Swarm tab re-renders its map on every peer RTT ping; even with the window hidden, timers and the
peers table keep calling), and once None's count (~78 000 at start-up) reaches zero the process dies:
"Fatal Python error: none_dealloc: deallocating None" (seen after ~4 minutes in a 3-peer swarm,
about 550 references lost a second with the Swarm tab open). Python 3.12+ makes None immortal, so
there a lost reference is harmless.
"""

from __future__ import annotations

import gc
import sys

import pytest

pytest.importorskip("PySide6")

CALLS = 2000


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12")
def test_void_qt_calls_keep_none_referenced(qapp):
    from PySide6.QtWidgets import QLabel, QWidget

    widget, label = QWidget(), QLabel()
    gc.collect()
    before = sys.getrefcount(None)
    for _ in range(CALLS):
        widget.update()
        widget.setAccessibleDescription("layer map")
        label.setText("gap: layers 10-11")
    gc.collect()
    lost = before - sys.getrefcount(None)
    assert lost < CALLS // 2, (
        f"{lost} references to None lost over {3 * CALLS} void Qt calls: this Qt binding "
        "aborts a long-running app (none_dealloc); install one pyproject.toml allows")
