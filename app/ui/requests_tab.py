"""Requests tab: the live request table; selecting a row shows its segments and summary line."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QSplitter, QVBoxLayout, QWidget

from app.ui.requests_model import RequestsModel, SegmentsModel
from app.ui.table_model import ROW_KEY_ROLE
from app.ui.widgets import mono_font, table_view


class RequestsTab(QWidget):
    """Requests (newest first) above, the selected request's route below."""

    def __init__(self, model: RequestsModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = model
        self.segments = SegmentsModel(self)
        self.view = table_view(model)
        self.segments_view = table_view(self.segments)
        self.summary = QPlainTextEdit()
        self.summary.setReadOnly(True)
        self.summary.setFont(mono_font())
        self.summary.setMaximumHeight(72)
        self.summary.setPlaceholderText("Select a request to see its route and its summary line.")
        self.detail_title = QLabel("<b>Route</b>")
        detail = QWidget()
        detail_layout = QVBoxLayout(detail)
        detail_layout.setContentsMargins(0, 0, 0, 0)
        detail_layout.addWidget(self.detail_title)
        detail_layout.addWidget(self.segments_view, 1)
        detail_layout.addWidget(QLabel("Summary line (the same as node.log's <tt>DIAG: request complete</tt>)"))
        detail_layout.addWidget(self.summary)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.view)
        splitter.addWidget(detail)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)
        self.view.selectionModel().selectionChanged.connect(self.show_selected)
        model.dataChanged.connect(self._on_data_changed)

    def selected_key(self) -> str | None:
        rows = self.view.selectionModel().selectedRows()
        return rows[0].data(ROW_KEY_ROLE) if rows else None

    def select(self, request_id: str) -> None:
        row = self.model.row_of(request_id)
        if row >= 0:
            self.view.selectRow(row)

    def _on_data_changed(self, top_left, bottom_right, *_roles) -> None:
        key = self.selected_key()
        if key is not None and top_left.row() <= self.model.row_of(key) <= bottom_right.row():
            self.show_selected()

    def show_selected(self, *_args) -> None:
        key = self.selected_key()
        trace = self.model.trace(key) if key else None
        self.segments.show_trace(trace)
        if trace is None:
            self.detail_title.setText("<b>Route</b>")
            self.summary.setPlainText("")
            return
        if trace.choice_routes:  # n choices that went different ways: the segments below are the first's
            routes = " | ".join(f"{route or 'none'} via {', '.join(ids) or '-'}" for route, ids in trace.choice_routes)
            route = f"choices went different ways ({html.escape(routes)}); the first choice's {len(trace.segments)} segment(s)"
        else:
            route = f"{trace.route or 'not chosen yet'}, {len(trace.segments)} segment(s)"
        self.detail_title.setText(
            f"<b>Route of {trace.request_id[:8]}</b>: {route}"
            + (f", assembled {trace.assemblies}× (every choice's tries)" if trace.assemblies > 1 and trace.choice_routes
               else f", assembled {trace.assemblies}×" if trace.assemblies > 1 else "")
            # (a peer's error text: never read as HTML)
            + (f" — first attempt failed: {html.escape(trace.first_attempt_cause)}" if trace.first_attempt_cause else ""))
        self.summary.setPlainText(trace.summary_line() if trace.done else "(in flight: the summary line is "
                                  "written when the request finishes)")
