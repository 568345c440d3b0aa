"""The painted layer map and the live throughput plot of the Swarm tab.

LayerMapView draws one model's ModelMap (app/ui/swarm_model.py): an axis of layers, a coverage
row (holders per layer, gaps hatched and named), then one row per holder with a bar over the
layers it serves, filled by its measured ms/layer (and the figure written in the bar: colour is
never the only cue), loading ranges hatched with their fetch percentage, and the last request's
chain drawn over the bars hop by hop with each hop's time. RatePlot draws tokens/s and
requests/min. Both only paint what they are given; the table beside them carries the same rows
for the keyboard and screen readers.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.ui import fmt
from app.ui.swarm_model import Holder, ModelMap

LABEL_W = 170
AXIS_H = 22
COVERAGE_H = 24
ROW_H = 28
PAD = 8

FAST, SLOW, UNKNOWN, WHOLE = QColor("#3a9d5d"), QColor("#c8553d"), QColor("#8c8c8c"), QColor("#5b7db1")
GAP = QColor("#b3261e")
CHAIN = QColor("#1d3f72")


def speed_color(ms: float | None, fastest: float | None, slowest: float | None) -> QColor:
    """Green for the fastest holder's ms/layer, turning red as a holder is slower than it, fully
    red at twice its time (so near-equal holders look alike); grey when not measured."""
    if ms is None or fastest is None or slowest is None or fastest <= 0:
        return UNKNOWN
    t = min(1.0, max(0.0, ms / fastest - 1.0))
    return QColor.fromRgbF(FAST.redF() + (SLOW.redF() - FAST.redF()) * t,
                           FAST.greenF() + (SLOW.greenF() - FAST.greenF()) * t,
                           FAST.blueF() + (SLOW.blueF() - FAST.blueF()) * t)


def _text_on(color: QColor) -> QColor:
    return QColor("black") if color.lightnessF() > 0.6 else QColor("white")


class LayerMapView(QWidget):
    """Paints a ModelMap; `set_map(None)` shows what to do when no model is served anywhere."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.map: ModelMap | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.setAccessibleName("Layer map")
        self.setToolTip("Which node holds which layers of the selected model; the last request's chain "
                        "is drawn as numbered hops with each hop's time")

    def set_map(self, model_map: ModelMap | None) -> None:
        self.map = model_map
        self.setAccessibleDescription(self.describe())
        self.updateGeometry()
        self.update()

    def describe(self) -> str:
        """The map in words (the accessible description, and tests)."""
        m = self.map
        if m is None:
            return "No model is served in the swarm yet."
        rows = [f"{h.node_id[:8]}{' (this node)' if h.this_node else ''}: layers "
                f"{fmt.layers([h.start, h.end])}, {h.role}" for h in m.holders]
        chain = m.chain_text()
        return f"{m.name}, {m.n_layers} layers, {m.coverage_text()}. " + "; ".join(rows) + (f". {chain}" if chain else "")

    def sizeHint(self) -> QSize:
        rows = len(self.map.holders) if self.map else 1
        return QSize(720, AXIS_H + COVERAGE_H + rows * ROW_H + 2 * PAD + 18)

    def minimumSizeHint(self) -> QSize:
        return QSize(400, self.sizeHint().height())

    # --- geometry ---

    def _x(self, layer: float) -> float:
        assert self.map is not None
        width = max(1.0, self.width() - LABEL_W - 2 * PAD)
        return LABEL_W + PAD + width * layer / max(1, self.map.n_layers)

    def _row_y(self, i: int) -> float:
        return PAD + AXIS_H + COVERAGE_H + i * ROW_H

    def bar_rect(self, i: int, h: Holder) -> QRectF:
        return QRectF(self._x(h.start), self._row_y(i) + 4, self._x(h.end) - self._x(h.start), ROW_H - 8)

    # --- painting ---

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        text = self.palette().color(QPalette.ColorRole.WindowText)
        if self.map is None:
            p.setPen(text)
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter,
                       "No model is served in the swarm yet: load one in the Models tab, or wait for peers.")
            return
        m = self.map
        self._paint_axis(p, m, text)
        self._paint_coverage(p, m, text)
        measured = [h.ms_per_layer for h in m.holders if h.ms_per_layer is not None and not h.whole]
        fastest, slowest = (min(measured), max(measured)) if measured else (None, None)
        for i, h in enumerate(m.holders):
            self._paint_holder(p, i, h, text, fastest, slowest)
        self._paint_chain(p, m, text)

    def _paint_axis(self, p: QPainter, m: ModelMap, text: QColor) -> None:
        p.setPen(text)
        step = max(1, round(m.n_layers / 12))
        for layer in range(0, m.n_layers + 1, step):
            x = self._x(layer)
            p.drawLine(QPointF(x, PAD + AXIS_H - 4), QPointF(x, PAD + AXIS_H))
            if layer < m.n_layers:
                p.drawText(QRectF(x - 20, PAD, 40, AXIS_H - 4), Qt.AlignmentFlag.AlignCenter, str(layer))
        p.drawText(QRectF(0, PAD, LABEL_W, AXIS_H), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                   "layer")

    def _paint_coverage(self, p: QPainter, m: ModelMap, text: QColor) -> None:
        y = PAD + AXIS_H + 2
        p.setPen(text)
        p.drawText(QRectF(0, y, LABEL_W, COVERAGE_H - 4), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                   "holders per layer")
        whole = sum(1 for h in m.holders if h.whole)  # each holds every layer (llama.cpp, the model whole)
        for layer, slices in enumerate(m.counts):
            count = slices + whole
            cell = QRectF(self._x(layer) + 1, y, self._x(layer + 1) - self._x(layer) - 2, COVERAGE_H - 6)
            if count == 0:
                p.fillRect(cell, QBrush(GAP, Qt.BrushStyle.BDiagPattern))
                p.setPen(QPen(GAP, 1.5))
                p.drawRect(cell)
            else:
                shade = QColor(text)
                shade.setAlphaF(min(0.6, 0.15 * count))
                p.fillRect(cell, shade)
            p.setPen(GAP if count == 0 else text)
            if cell.width() >= 14:
                p.drawText(cell, Qt.AlignmentFlag.AlignCenter, "gap" if count == 0 and cell.width() >= 26
                           else str(count))

    def _paint_holder(self, p: QPainter, i: int, h: Holder, text: QColor, fastest: float | None,
                      slowest: float | None) -> None:
        y = self._row_y(i)
        label = h.node_id[:8] + (" (you)" if h.this_node else "")
        font = QFont(self.font())
        font.setBold(h.this_node)
        p.setFont(font)
        p.setPen(text)
        p.drawText(QRectF(0, y, LABEL_W, ROW_H), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, label)
        p.setFont(self.font())
        rect = self.bar_rect(i, h)
        color = WHOLE if h.whole else speed_color(h.ms_per_layer, fastest, slowest)
        if h.loading:
            p.fillRect(rect, QBrush(color, Qt.BrushStyle.Dense5Pattern))
            p.setPen(QPen(color.darker(130), 1.5, Qt.PenStyle.DashLine))
        elif h.standby:  # lighter, so the chain's bars stand out
            light = QColor(color)
            light.setAlphaF(0.55)
            p.fillRect(rect, light)
            p.setPen(QPen(color.darker(130), 1))
        else:
            p.fillRect(rect, color)
            p.setPen(QPen(color.darker(140), 1))
        p.drawRect(rect)
        if h.whole:
            words = "whole model (llama.cpp)"
        elif h.loading:
            words = h.role
        else:
            words = f"{h.ms_per_layer:.1f} ms/layer" if h.ms_per_layer is not None else "not measured yet"
            if h.standby:
                words += " · standby"
        p.setPen(_text_on(color) if not h.loading else text)
        room = rect
        if h.hop is not None and h.hop_layers and h.hop_layers != (h.start, h.end):  # the hop's chip covers part
            ran = self.hop_rect(i, h)
            left, right = QRectF(rect.left(), rect.top(), ran.left() - rect.left(), rect.height()), \
                QRectF(ran.right(), rect.top(), rect.right() - ran.right(), rect.height())
            room = max(left, right, key=lambda r: r.width())
        p.drawText(room.adjusted(4, 0, -4, 0), Qt.AlignmentFlag.AlignCenter, words)

    def hop_rect(self, i: int, h: Holder) -> QRectF:
        """The part of a holder's bar its hop of the last request ran."""
        a, b = h.hop_layers or (h.start, h.end)
        bar = self.bar_rect(i, h)
        return QRectF(self._x(a), bar.top(), self._x(b) - self._x(a), bar.height())

    def _paint_chain(self, p: QPainter, m: ModelMap, text: QColor) -> None:
        hops = sorted(((h.hop, i, h) for i, h in enumerate(m.holders) if h.hop is not None), key=lambda t: t[0])
        if not hops:
            return
        pen = QPen(CHAIN, 2.5)
        previous = None
        for hop, i, h in hops:
            rect = self.hop_rect(i, h)
            p.setPen(pen)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRect(rect.adjusted(-1.5, -1.5, 1.5, 1.5))
            if previous is not None:  # from the previous hop's last layer down to this hop's first
                a = QPointF(previous.right(), previous.bottom())
                b = QPointF(rect.left(), rect.top())
                path = QPainterPath(a)
                path.cubicTo(QPointF(a.x(), (a.y() + b.y()) / 2), QPointF(b.x(), (a.y() + b.y()) / 2), b)
                p.drawPath(path)
                p.setBrush(CHAIN)
                p.drawPolygon([b, QPointF(b.x() - 4, b.y() - 7), QPointF(b.x() + 4, b.y() - 7)])
            badge = QRectF(rect.left() - 9, rect.top() - 7, 18, 18)
            p.setBrush(CHAIN)
            p.drawEllipse(badge)
            p.setPen(QColor("white"))
            p.drawText(badge, Qt.AlignmentFlag.AlignCenter, str(hop + 1))
            if h.hop_ms is not None:  # the hop's time, on a chip at the right end of what it ran
                words = fmt.ms(h.hop_ms)
                width = p.fontMetrics().horizontalAdvance(words) + 10
                chip = QRectF(rect.right() - width - 2, rect.top() + 2, width, rect.height() - 4)
                p.setPen(Qt.PenStyle.NoPen)
                p.drawRoundedRect(chip, 4, 4)
                p.setPen(QColor("white"))
                p.drawText(chip, Qt.AlignmentFlag.AlignCenter, words)
            previous = rect
        p.setPen(text)  # (the palette's: readable on light and dark)
        total = m.chain_text()
        y = self._row_y(len(m.holders)) + 2
        p.drawText(QRectF(LABEL_W + PAD, y, self.width() - LABEL_W - 2 * PAD, 16),
                   Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, total)


class RatePlot(QWidget):
    """Two small line plots over the last minutes: tokens/s and requests/min."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.tokens: list[float] = []
        self.requests: list[float] = []
        self.window_s = 300.0
        self.setMinimumHeight(90)
        self.setAccessibleName("Throughput plot")
        self.setToolTip("Tokens per second and requests per minute this node served, last 5 minutes")

    def set_series(self, tokens: list[float], requests: list[float], window_s: float) -> None:
        self.tokens, self.requests, self.window_s = tokens, requests, window_s
        self.setAccessibleDescription(f"tokens/s now {tokens[-1]:.1f}, requests/min now {requests[-1]:.1f}"
                                      if tokens else "no requests yet")
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(720, 110)

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        text = self.palette().color(QPalette.ColorRole.WindowText)
        half = (self.width() - 3 * PAD) / 2
        self._plot(p, QRectF(PAD, PAD, half, self.height() - 2 * PAD), self.tokens, "tokens/s", FAST, text)
        self._plot(p, QRectF(2 * PAD + half, PAD, half, self.height() - 2 * PAD), self.requests, "requests/min",
                   CHAIN.lighter(150), text)

    def _plot(self, p: QPainter, box: QRectF, values: list[float], title: str, color: QColor, text: QColor) -> None:
        p.setPen(QPen(text, 1))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(box)
        top = max(values) if values and max(values) > 0 else 1.0
        now = values[-1] if values else 0.0
        p.drawText(box.adjusted(6, 2, -6, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                   f"{title}: {now:,.1f} now, peak {top if values and max(values) > 0 else 0:,.1f}")
        p.drawText(box.adjusted(6, 0, -6, -2), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom,
                   f"last {self.window_s / 60:.0f} min")
        if len(values) < 2:
            return
        inner = box.adjusted(4, 20, -4, -16)
        step = inner.width() / (len(values) - 1)
        path = QPainterPath(QPointF(inner.left(), inner.bottom() - inner.height() * values[0] / top))
        for k, v in enumerate(values[1:], start=1):
            path.lineTo(QPointF(inner.left() + k * step, inner.bottom() - inner.height() * v / top))
        p.setPen(QPen(color, 2))
        p.drawPath(path)
