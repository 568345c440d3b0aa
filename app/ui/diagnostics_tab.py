"""Diagnostics tab: the node's plain-text report, and the two copy buttons."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.actions import AppActions
from app.tasks import spawn
from app.ui.widgets import mono_font


class DiagnosticsTab(QWidget):
    """Shows the redacted report; refreshed when the tab is shown or on request."""

    def __init__(self, actions: AppActions, parent: QWidget | None = None):
        super().__init__(parent)
        self.actions = actions
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(mono_font())
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setPlaceholderText("Building the report…")
        self.refresh_button = QPushButton("Refresh")
        self.copy_button = QPushButton("Copy diagnostics")
        self.copy_button.setToolTip("Redacted: addresses become tags; no API key, no file paths. "
                                    "Safe to paste in a public support thread.")
        self.copy_full_button = QPushButton("Copy full report (private)")
        self.copy_full_button.setToolTip("Keeps network addresses. For your own machine only.")
        self.refresh_button.clicked.connect(self.refresh)
        self.copy_button.clicked.connect(lambda: self._copy(full=False))
        self.copy_full_button.clicked.connect(lambda: self._copy(full=True))
        self.status = QLabel("Shown redacted, exactly as “Copy diagnostics” copies it.")
        buttons = QHBoxLayout()
        buttons.addWidget(self.refresh_button)
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.copy_full_button)
        buttons.addWidget(self.status, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addWidget(self.text, 1)
        self.last_report: str | None = None

    def refresh(self) -> None:
        spawn(self.async_refresh(), what="building the diagnostics report", on_error=self.status.setText)

    async def async_refresh(self) -> str:
        text = await self.actions.async_report(full=False)
        self.last_report = text
        bar = self.text.verticalScrollBar()
        position = bar.value()
        self.text.setPlainText(text)
        bar.setValue(position)
        return text

    def _copy(self, *, full: bool) -> None:
        spawn(self.actions.async_copy_diagnostics(full=full), what="copying diagnostics",
              on_error=self.status.setText)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh()
