"""Light and dark palettes (Fusion), or the platform's own colours ("system")."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

SCHEMES = ("system", "light", "dark")

_DARK = {
    QPalette.ColorRole.Window: "#232629", QPalette.ColorRole.WindowText: "#eff0f1",
    QPalette.ColorRole.Base: "#1b1e20", QPalette.ColorRole.AlternateBase: "#2a2e32",
    QPalette.ColorRole.ToolTipBase: "#31363b", QPalette.ColorRole.ToolTipText: "#eff0f1",
    QPalette.ColorRole.Text: "#eff0f1", QPalette.ColorRole.Button: "#31363b",
    QPalette.ColorRole.ButtonText: "#eff0f1", QPalette.ColorRole.BrightText: "#ff6b6b",
    QPalette.ColorRole.Highlight: "#3d7bc4", QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#7cb7ff", QPalette.ColorRole.PlaceholderText: "#9a9ea3",
    QPalette.ColorRole.Mid: "#6c7177",
}


def apply(app: QApplication | None, scheme: str) -> None:
    """Set the application's palette: the style's standard one for light and system, or dark."""
    if app is None:
        return
    if not hasattr(apply, "_system"):
        apply._system = (app.style().objectName(), QPalette(app.palette()))  # what the platform gave
        apply._current = "system"
    if scheme == apply._current:
        return  # (a style change re-polishes every widget: not for nothing)
    apply._current = scheme
    style_name, system_palette = apply._system
    if scheme == "system":
        app.setStyle(style_name)
        app.setPalette(system_palette)
        return
    app.setStyle("Fusion")
    palette = app.style().standardPalette()
    if scheme == "dark":
        for role, color in _DARK.items():
            palette.setColor(role, QColor(color))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#7a7f85"))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#7a7f85"))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, QColor("#7a7f85"))
    app.setPalette(palette)
