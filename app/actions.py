"""What the tray menu and the window buttons do with the clipboard.

"Copy diagnostics" is the redacted report (addresses tagged, no API key, no file paths): what a
user pastes in a public support thread. "Copy full report" keeps addresses, for the user's own
eyes. Both come from the node's own report builder, never re-assembled here.
"""

from __future__ import annotations

import logging
import socket

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QGuiApplication

from app.host import NodeHost
from node.diagnostics import report_redactor
from node.redact import Redactor

log = logging.getLogger(__name__)


class AppActions(QObject):
    """Clipboard actions; `message` tells the user what happened (tray balloon / status bar)."""

    message = Signal(str)

    def __init__(self, host: NodeHost, parent: QObject | None = None):
        super().__init__(parent)
        self.host = host

    def _copy(self, text: str, what: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.message.emit(f"{what} copied to the clipboard")

    def copy_api_url(self) -> None:
        """Copy the OpenAI base URL (http://localhost:PORT/v1)."""
        self._copy(self.host.node.api_url, "API URL")

    def copy_api_key(self) -> None:
        """Copy the API key (Bearer token for every request)."""
        if not self.host.node.api_key:
            self.message.emit("the API key is not available: the node has not started")
            return
        self._copy(self.host.node.api_key, "API key")

    async def async_report(self, *, full: bool = False) -> str:
        """The diagnostics report text (redacted unless full). A node that could not start says
        why first (its error names a path or an address: redacted like the report)."""
        node = self.host.node
        lead = [self.host.status_line()] if self.host.start_error is not None else []
        try:  # the reason goes through the report's own redactor: one salt, every known host
            return await node.async_report(full=full, lead=lead)
        except Exception as exc:
            log.exception("diagnostics report failed")
            text = f"SwarmLLM diagnostics could not be built: {type(exc).__name__}\n"
        try:
            redactor = report_redactor(node.report_parts(), full=full)
        except Exception:  # a node too broken to describe itself still redacts paths and addresses
            redactor = Redactor(enabled=not full, secrets_to_hide=[node.api_key or ""],
                                known_hosts=[socket.gethostname(), *getattr(node, "host_names", [])],
                                user_names=list(getattr(node, "user_names", [])))
        return "".join(redactor.text(line) + "\n\n" for line in lead) + text

    async def async_copy_diagnostics(self, *, full: bool = False) -> str:
        """Build the report and put it on the clipboard; returns the text."""
        text = await self.async_report(full=full)
        self._copy(text, "Full report (private: contains addresses)" if full else "Diagnostics (redacted)")
        log.info("DIAG: diagnostics copied full=%s chars=%d", full, len(text))
        return text
