"""Peers tab: the peer table, with addresses redacted unless "Show addresses" is ticked."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QStackedWidget, QVBoxLayout, QWidget

from app.host import NodeHost
from app.ui.peers_model import PeersModel
from app.ui.widgets import table_view

EMPTY_OFF = ("<b>No peers.</b><br>The peer network is not running in this node, so it serves only the "
             "models on this machine.<br>Peers on your LAN (mDNS) and through relays will appear here "
             "when it is.")
EMPTY_ON = ("<b>No peers yet.</b><br>Other SwarmLLM nodes on your LAN appear here automatically; "
            "nodes elsewhere are reached through a relay.")


class PeersTab(QWidget):
    """The table, or a plain empty-state message while it has no rows."""

    def __init__(self, host: NodeHost, model: PeersModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.host = host
        self.model = model
        self.show_addresses = QCheckBox("Show addresses")
        self.show_addresses.setToolTip("Addresses are replaced by tags such as <private-ip-1a2b> so a "
                                       "screenshot is safe to share; tick to see them.")
        self.show_addresses.toggled.connect(model.set_show_addresses)
        top = QHBoxLayout()
        self.count = QLabel()
        top.addWidget(self.count, 1)
        top.addWidget(self.show_addresses)
        self.view = table_view(model)
        self.empty = QLabel()
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.view)
        self.stack.addWidget(self.empty)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.stack, 1)
        for signal in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            signal.connect(self._update)
        host.started.connect(self._update)
        self._update()

    def _update(self, *_args) -> None:
        n = self.model.rowCount()
        network_on = self.host.node.peers is not None
        self.empty.setText(EMPTY_ON if network_on else EMPTY_OFF)
        self.stack.setCurrentWidget(self.view if n else self.empty)
        self.count.setText(f"{n} peer(s)" if network_on else "peer network off")
