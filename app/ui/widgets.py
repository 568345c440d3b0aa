"""Small shared widgets: a configured table view and the first-run banner."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.host import NodeHost

RESIZE_ROWS = 30  # rows (beyond the visible ones) a ResizeToContents column is fitted to
MAX_COLUMN_PX = 320  # the widest a column fits itself to its contents (longer text is elided)


def table_view(model, parent: QWidget | None = None, *, stretch_last: bool = True) -> QTableView:
    """A read-only, row-selecting table over a model."""
    view = QTableView(parent)
    view.setModel(model)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    view.setAlternatingRowColors(True)
    view.setWordWrap(False)
    view.verticalHeader().setVisible(False)
    view.verticalHeader().setDefaultSectionSize(24)
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    # Fit the columns to the rows on screen and a few more, never to every row: with the default
    # (1000 rows) each changed cell re-measured the whole table, 64k data() calls and 0.2-0.4 s
    # on the loop per in-flight row's tick once the requests table held its 500 rows.
    header.setResizeContentsPrecision(RESIZE_ROWS)
    # A long name (a 90-character GGUF file name, a repo path) widened its column past the window and
    # pushed State and Memory off screen: columns stop at MAX_COLUMN_PX, the text elided in the
    # middle (a model id's hash suffix stays in view; the cell's tooltip has it whole)
    header.setMaximumSectionSize(MAX_COLUMN_PX)
    view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    header.setStretchLastSection(stretch_last)
    header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
    return view


def mono_font() -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setPointSize(max(9, font.pointSize()))
    return font


class FirstRunBanner(QFrame):
    """Says plainly that no model can serve, and how to fix it. Hidden when a model serves."""

    add_model_clicked = Signal()
    open_folder_clicked = Signal()

    def __init__(self, host: NodeHost, parent: QWidget | None = None):
        super().__init__(parent)
        self.host = host
        self.setObjectName("firstRunBanner")
        self.setStyleSheet("#firstRunBanner { background: #fff4d6; border: 1px solid #e0b44c; "
                           "border-radius: 6px; } QLabel { color: #4a3800; }")
        self.title = QLabel("<b>No model can serve requests yet</b>")
        self.title.setWordWrap(True)  # a start error is one long line: wrapped, not a window wider than the screen
        self.text = QLabel()
        self.text.setTextFormat(Qt.TextFormat.PlainText)  # the reason as written, never read as HTML
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.add_button = QPushButton("Add model file…")
        self.add_button.clicked.connect(self.add_model_clicked)
        self.folder_button = QPushButton("Open models folder")
        self.folder_button.clicked.connect(self.open_folder_clicked)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.folder_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.text)
        layout.addLayout(buttons)
        self._shown: tuple | None = None  # what it shows now: nothing is redrawn when that is unchanged
        host.state_changed.connect(self.update_from_host)
        self.update_from_host()

    def update_from_host(self, *_args) -> None:
        """Read the text again: on state changes and on the window's folder-watch timer, since some of
        it (a file skipped, a download's progress) changes with no state change."""
        message = self.host.first_run_text()
        shown = (message, self.host.start_error is None,
                 self.host.start_error is None or self.host.models_dir.is_dir())
        if shown == self._shown:
            return
        self._shown = shown
        self.setVisible(message is not None)
        if message is not None:
            first, _, rest = message.partition("\n")
            self.title.setText(f"<b>{html.escape(first)}</b>")  # (a path or a peer's text may hold `<`)
            self.text.setText(rest)
            self.text.setVisible(bool(rest))
        # a node that could not start serves no model added now: no button that seems to fix it
        self.add_button.setVisible(self.host.start_error is None)
        # nor a folder that is not there (a data dir that could not be used)
        self.folder_button.setVisible(self.host.start_error is None or self.host.models_dir.is_dir())


class ElidedLabel(QLabel):
    """One line that never widens its window: text longer than the label is elided at the right
    ("…"); `full_text` keeps the whole of it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.full_text = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(1)

    def set_full_text(self, text: str) -> None:
        self.full_text = text
        self._elide()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self.full_text, Qt.TextElideMode.ElideRight, max(1, self.width())))
