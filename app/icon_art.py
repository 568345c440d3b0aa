"""Draws the tray icons: one look per state, so the icon tells the state at a glance.

Run `python -m app.icon_art` to (re)write `resources/icons/tray-<look>-<size>.png`; the app loads
those files and falls back to drawing them when they are missing. Colour is never the only cue
(colour-blind users): error shows "!", paused shows two bars, no-model shows hollow nodes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QGuiApplication, QImage, QPainter, QPen

# look -> fill colour
LOOKS = {
    "serving": "#2e9d4f",
    "no_model": "#d9961a",
    "error": "#c8372d",
    "paused": "#5b6b85",
    "starting": "#8a8f98",
}
SIZES = (32, 64, 256)


def _nodes(size: float) -> list[QPointF]:
    """Three peers on a triangle around the centre."""
    c, r = size / 2, size * 0.24
    return [QPointF(c + r * math.cos(a), c + r * math.sin(a))
            for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]


def draw_icon(look: str, size: int) -> QImage:
    """Render one icon as a transparent ARGB image."""
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    p = QPainter(image)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    fill = QColor(LOOKS[look])
    edge = max(1.0, size / 32)
    p.setPen(QPen(fill.darker(150), edge))
    p.setBrush(QBrush(fill))
    p.drawEllipse(QRectF(edge / 2, edge / 2, size - edge, size - edge))
    white = QColor("#ffffff")
    if look == "error":
        font = QFont("DejaVu Sans", weight=QFont.Weight.Black)
        font.setPixelSize(int(size * 0.72))
        p.setFont(font)
        p.setPen(white)
        p.drawText(QRectF(0, 0, size, size), Qt.AlignmentFlag.AlignCenter, "!")
    elif look == "paused":
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(white)
        w, h = size * 0.14, size * 0.46
        for x in (size * 0.33, size * 0.53):
            p.drawRoundedRect(QRectF(x, (size - h) / 2, w, h), w / 4, w / 4)
    else:
        nodes = _nodes(size)
        line = QColor(white)
        line.setAlphaF(0.55 if look == "starting" else 0.95)
        p.setPen(QPen(line, max(1.0, size / 20)))
        for i in range(3):
            p.drawLine(nodes[i], nodes[(i + 1) % 3])
        radius = size * 0.12
        hollow = look == "no_model"
        p.setPen(QPen(white, max(1.0, size / 22)) if hollow else Qt.PenStyle.NoPen)
        p.setBrush(QBrush(fill) if hollow else QBrush(line))
        for n in nodes:
            p.drawEllipse(n, radius, radius)
    p.end()
    return image


def icon_file(directory: Path, look: str, size: int) -> Path:
    return directory / f"tray-{look}-{size}.png"


def write_all(directory: Path) -> list[Path]:
    """Write every look at every size; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for look in LOOKS:
        for size in SIZES:
            path = icon_file(directory, look, size)
            if not draw_icon(look, size).save(str(path)):
                raise OSError(f"could not write {path}")
            written.append(path)
    app_icon = directory / "swarmllm.png"
    draw_icon("serving", 256).save(str(app_icon))
    written.append(app_icon)
    return written


def main() -> int:
    """Entry point: write the icons into resources/icons."""
    from node.resources import resources_dir

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    for path in write_all(resources_dir() / "icons"):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
