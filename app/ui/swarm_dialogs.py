"""Invite a device / Join a swarm: the two dialogs behind the tray menu and the Peers tab.

The invite dialog shows the one-time code as text (selectable, with a Copy button) and as a QR
code (segno computes the matrix; Qt paints it), and says when it expires. The join dialog takes a
code and joins; the node does the work, off the Qt thread's way (coroutines on the qasync loop).
Both are non-modal (`open()`): a modal dialog inside a coroutine would nest event loops.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import segno
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from app.host import NodeHost
from app.tasks import spawn
from node.errors import NodeError


def qr_pixmap(text: str, size_px: int = 240) -> QPixmap:
    """A QR code of text (dark on white, with its quiet zone), size_px square."""
    qr = segno.make(text, error="m", micro=False)
    rows = list(qr.matrix_iter(border=4))
    n = len(rows)
    image = QImage(size_px, size_px, QImage.Format.Format_RGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor("black"))
    cell = size_px / n
    for y, row in enumerate(rows):
        for x, dark in enumerate(row):
            if dark:
                painter.drawRect(QRectF(x * cell, y * cell, cell + 0.5, cell + 0.5))
    painter.end()
    return QPixmap.fromImage(image)


class InviteDialog(QDialog):
    """Creates an invite when shown, then displays it."""

    def __init__(self, host: NodeHost, parent: QWidget | None = None):
        super().__init__(parent)
        self.host = host
        self.setWindowTitle("Invite a device")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.intro = QLabel("On the other device, choose <b>Join a swarm…</b> (or run "
                            "<code>swarmllm join CODE</code>) and give it this code. It works once.")
        self.intro.setWordWrap(True)
        self.code = QLineEdit()
        self.code.setReadOnly(True)
        self.code.setPlaceholderText("creating an invite…")
        self.code.setAccessibleName("Invite code")
        self.copy = QPushButton("Copy code")
        self.copy.setEnabled(False)
        self.copy.clicked.connect(self._copy)
        self.qr = QLabel()
        self.qr.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.qr.setAccessibleName("Invite code as a QR code")
        self.status = QLabel()
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.code, 1)
        row.addWidget(self.copy)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.intro)
        layout.addLayout(row)
        layout.addWidget(self.qr, 1)
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        self.resize(460, 440)

    def start(self) -> None:
        """Show the dialog and create the invite."""
        self.open()
        spawn(self._async_create(), what="creating an invite", on_error=self._failed)

    async def _async_create(self) -> None:
        try:
            code, expires_at = await self.host.node.async_invite()
        except NodeError as exc:
            if isValid(self.status):
                self.status.setText(f"No invite: {exc.message}")
            return
        if not isValid(self.code):  # closed (deleted) meanwhile: a code no one sees, used by no one
            return
        self.code.setText(code)
        self.copy.setEnabled(True)
        self.qr.setPixmap(qr_pixmap(code))
        hours = max(0.0, (expires_at - time.time()) / 3600)
        self.status.setText(f"Valid for {hours:.0f} hours, for one device. Treat it like a password "
                            "until it is used.")

    def _failed(self, text: str) -> None:
        """An error other than a NodeError (spawn's on_error), said if the dialog is still open (review
        r62: it wrote to the label of a dialog closed meanwhile, a RuntimeError traceback)."""
        if isValid(self.status):
            self.status.setText(text)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code.text())
        self.status.setText("Code copied to the clipboard.")


class JoinDialog(QDialog):
    """Paste a code, press Join."""

    def __init__(self, host: NodeHost, parent: QWidget | None = None, *,
                 tell: Callable[[str], object] | None = None):
        super().__init__(parent)
        self.host = host
        # where the join's outcome goes once the dialog is closed (deleted on close) before it ended:
        # written to its deleted labels, it was a RuntimeError traceback in the log and no word
        self._tell = tell
        self.setWindowTitle("Join a swarm")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        intro = QLabel("Paste the invite code made on a device of the swarm you want to join. This "
                       "device then leaves its current swarm.")
        intro.setWordWrap(True)
        self.code = QLineEdit()
        self.code.setPlaceholderText("swarmllm1-…")
        self.code.setAccessibleName("Invite code")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.join_button = self.buttons.addButton("Join", QDialogButtonBox.ButtonRole.AcceptRole)
        self.join_button.clicked.connect(self.join)
        self.buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.code)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.resize(460, 160)

    def join(self) -> None:
        """Join with the code in the field."""
        code = self.code.text().strip()
        if not code:
            self.status.setText("Paste a code first.")
            return
        self.join_button.setEnabled(False)
        self.status.setText("Joining…")
        spawn(self._async_join(code), what="joining a swarm", on_error=self._failed)

    async def _async_join(self, code: str) -> None:
        try:
            swarm = await self.host.async_join(code)
        except NodeError as exc:
            self._failed(exc.message)
            return
        if self._say(f"Joined swarm {swarm}."):
            self.buttons.button(QDialogButtonBox.StandardButton.Cancel).setText("Close")

    def _failed(self, message: str) -> None:
        if self._say(f"Could not join: {message}"):
            self.join_button.setEnabled(True)

    def _say(self, text: str) -> bool:
        """Show the outcome; False when the dialog is gone (then it goes to `tell`)."""
        if isValid(self.status):
            self.status.setText(text)
            return True
        if self._tell is not None:
            self._tell(text)
        return False
