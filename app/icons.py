"""State → tray icon (files in resources/icons, drawn on the fly if a file is missing)."""

from __future__ import annotations

from functools import cache

from PySide6.QtGui import QIcon, QPixmap

from app.host import AppState
from app.icon_art import LOOKS, SIZES, draw_icon, icon_file
from node.resources import resources_dir

# app state -> icon look
LOOK_FOR_STATE = {
    AppState.STARTING: "starting",
    AppState.LOADING: "starting",
    AppState.STOPPING: "starting",
    AppState.SERVING: "serving",
    AppState.PAUSED: "paused",
    AppState.NO_MODEL: "no_model",
    AppState.ERROR: "error",
}


@cache
def look_icon(look: str) -> QIcon:
    """The icon for a look, with every size available."""
    assert look in LOOKS, look
    icon = QIcon()
    directory = resources_dir() / "icons"
    for size in SIZES:
        path = icon_file(directory, look, size)
        pixmap = QPixmap(str(path)) if path.is_file() else QPixmap()
        if pixmap.isNull():
            pixmap = QPixmap.fromImage(draw_icon(look, size))
        icon.addPixmap(pixmap)
    return icon


def state_icon(state: str) -> QIcon:
    """The tray icon for an app state."""
    return look_icon(LOOK_FOR_STATE[AppState(state)])
