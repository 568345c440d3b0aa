"""Peers tab: this node's swarm (invite, join, leave, remove a member) and the peer table, with
addresses redacted unless "Show addresses" is ticked."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.host import NodeHost
from app.tasks import spawn
from app.ui.peers_model import PeersModel
from app.ui.swarm_dialogs import InviteDialog, JoinDialog
from app.ui.table_model import ROW_KEY_ROLE
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
        self.swarm_label = QLabel()
        self.swarm_label.setToolTip("Only devices you invited join this swarm; the id is a hash, never "
                                    "the secret.")
        self.invite_button = QPushButton("Invite a device…")
        self.invite_button.setToolTip("A one-time code (and QR) another device uses to join this swarm")
        self.invite_button.clicked.connect(self.invite)
        self.join_button = QPushButton("Join a swarm…")
        self.join_button.setToolTip("Join another swarm with its invite code (this device leaves its own)")
        self.join_button.clicked.connect(self.join)
        self.remove_button = QPushButton("Remove from swarm")
        self.remove_button.setToolTip("Remove the selected peer: the swarm secret is rotated and its links close")
        self.remove_button.clicked.connect(self.remove_selected)
        self.leave_button = QPushButton("Leave swarm")
        self.leave_button.setToolTip("Leave this swarm: this device starts a new private swarm of its own")
        self.leave_button.clicked.connect(self.leave)
        self.refused_label = QLabel()
        self.refused_label.setWordWrap(True)
        self.refused_label.setAccessibleName("Peers refused")
        swarm_row = QHBoxLayout()
        swarm_row.addWidget(self.swarm_label, 1)
        for button in (self.invite_button, self.join_button, self.remove_button, self.leave_button):
            swarm_row.addWidget(button)
        # what a Join, Leave or Remove came to when its dialog could not say it (closed early, or none):
        # kept until the next one (review r62: on the count line, the next repaint wrote over it)
        self.outcome = QLabel()
        self.outcome.setWordWrap(True)
        self.outcome.setVisible(False)
        self.outcome.setAccessibleName("Swarm action outcome")
        top = QHBoxLayout()
        self.count = QLabel()
        top.addWidget(self.count, 1)
        top.addWidget(self.show_addresses)
        self.view = table_view(model)
        self.view.selectionModel().selectionChanged.connect(self._update)
        self.empty = QLabel()
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.view)
        self.stack.addWidget(self.empty)
        layout = QVBoxLayout(self)
        layout.addLayout(swarm_row)
        layout.addWidget(self.refused_label)
        layout.addWidget(self.outcome)
        layout.addLayout(top)
        layout.addWidget(self.stack, 1)
        for signal in (model.rowsInserted, model.rowsRemoved, model.modelReset, model.dataChanged):
            signal.connect(self._update)
        host.started.connect(self._update)
        host.swarm_changed.connect(self._update)
        self._update()

    def _update(self, *_args) -> None:
        n = self.model.rowCount()
        network_on = self.host.node.peers is not None
        self.empty.setText(EMPTY_ON if network_on else EMPTY_OFF)
        self.stack.setCurrentWidget(self.view if n else self.empty)
        self.count.setText(f"{n} peer(s)" if network_on else "peer network off")
        self.swarm_label.setText(self.swarm_text())
        private = network_on and not self.host.node.swarm_status()["open"]
        self.invite_button.setEnabled(private)
        self.join_button.setEnabled(network_on)
        self.leave_button.setEnabled(private)
        self.remove_button.setEnabled(private and self.selected_peer() is not None)
        refused = self.host.node.swarm_status()["refused"] if network_on else []
        self.refused_label.setVisible(bool(refused))
        self.refused_label.setText("Refused (not in this swarm): " + ", ".join(
            f"{r['peer']} ×{r['count']}" + ("" if r["by_us"] else " (refused us)") for r in refused[-8:]))
        self.refused_label.setToolTip("\n".join(f"{r['peer']}: {r['reason']}" + (f" ({r['hint']})" if r.get("hint")
                                                 else "") for r in refused[-20:]))

    def swarm_text(self) -> str:
        """"Swarm 1a2b3c4d (private) · 2 members connected · 1 refused"."""
        if self.host.node.peers is None:
            return "Swarm: peer network off"
        st = self.host.node.swarm_status()
        kind = "open: any node that opted in may link" if st["open"] else "private"
        text = f"Swarm {st['swarm']} ({kind}) · {st['members_connected']} member(s) connected"
        return text + (f" · {len(st['refused'])} refused" if st["refused"] else "")

    def say(self, text: str) -> None:
        """Show what a swarm action came to (hidden when empty)."""
        self.outcome.setText(text)
        self.outcome.setVisible(bool(text))

    def selected_peer(self) -> str | None:
        rows = self.view.selectionModel().selectedRows()
        return rows[0].data(ROW_KEY_ROLE) if rows else None

    def invite(self) -> InviteDialog:
        """Show a new invite code (and QR)."""
        dialog = InviteDialog(self.host, self)
        dialog.start()
        return dialog

    def join(self) -> JoinDialog:
        """Ask for a code and join its swarm."""
        self.say("")
        dialog = JoinDialog(self.host, self, tell=self.say)  # (closed before the join ended)
        dialog.open()
        return dialog

    def leave(self) -> None:
        """Leave the swarm (after a confirmation)."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Leave swarm",
                          "Leave this swarm? Every link closes and this device starts a new private swarm "
                          "of its own; to come back it needs a new invite.", QMessageBox.StandardButton.Cancel, self)
        box.addButton("Leave", QMessageBox.ButtonRole.AcceptRole).clicked.connect(
            lambda: spawn(self.host.async_leave(), what="leaving the swarm", on_error=self.say))
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def remove_selected(self) -> None:
        """Remove the selected peer from the swarm (after a confirmation)."""
        node_id = self.selected_peer()
        if node_id is None:
            return
        box = QMessageBox(QMessageBox.Icon.Warning, "Remove from swarm",
                          f"Remove {node_id[:8]} from this swarm? Its links close and the swarm secret "
                          "is rotated; the other members get the new one.",
                          QMessageBox.StandardButton.Cancel, self)
        box.addButton("Remove", QMessageBox.ButtonRole.AcceptRole).clicked.connect(
            lambda: spawn(self.host.async_remove_member(node_id), what="removing a member",
                          on_error=self.say))
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
