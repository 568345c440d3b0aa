"""The tray icon: its look tells the state; its menu holds the everyday actions."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.actions import AppActions
from app.host import AppState, NodeHost
from app.icons import state_icon
from app.tasks import spawn


class Tray:
    """QSystemTrayIcon + menu: Open, Copy API URL, Copy API key, Copy diagnostics,
    Pause contributing, Quit."""

    def __init__(self, host: NodeHost, actions: AppActions, *, on_open: Callable[[], None],
                 on_quit: Callable[[], None], on_invite: Callable[[], object] | None = None,
                 on_join: Callable[[], object] | None = None):
        self.host = host
        self.actions = actions
        self.icon = QSystemTrayIcon()
        self.menu = QMenu()
        self.open_action = self._add("Open SwarmLLM", on_open)
        self.menu.addSeparator()
        self.copy_url_action = self._add("Copy API URL", actions.copy_api_url)
        self.copy_key_action = self._add("Copy API key", actions.copy_api_key)
        self.copy_diagnostics_action = self._add(
            "Copy diagnostics", lambda: spawn(actions.async_copy_diagnostics(), what="copying diagnostics",
                                              on_error=actions.message.emit))
        self.menu.addSeparator()
        self.swarm_action = self._add("Swarm: -", None)
        self.swarm_action.setEnabled(False)  # information: which swarm, private or open
        self.invite_action = self._add("Invite a device…", on_invite)
        self.join_action = self._add("Join a swarm…", on_join)
        self.menu.addSeparator()
        self.pause_action = self._add("Pause contributing", None)
        self.pause_action.setCheckable(True)
        self.pause_action.setToolTip("Stop serving work for peers; this machine's own requests still run")
        self.pause_action.toggled.connect(lambda checked: host.set_contributing(not checked))
        self.menu.addSeparator()
        self.quit_action = self._add("Quit SwarmLLM", on_quit)
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(lambda reason: on_open() if reason in (
            QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick) else None)
        actions.message.connect(self._balloon)
        host.state_changed.connect(self._on_state)
        self._on_state()

    def _add(self, text: str, slot: Callable[[], object] | None) -> QAction:
        action = QAction(text, self.menu)
        if slot is not None:
            action.triggered.connect(lambda _checked=False: slot())
        self.menu.addAction(action)
        return action

    def _on_state(self, *_args) -> None:
        state = self.host.state
        self.icon.setIcon(state_icon(state))
        self.icon.setToolTip(self.host.status_line())
        started = self.host.is_started
        for action in (self.copy_url_action, self.copy_key_action):
            action.setEnabled(started)
        self.pause_action.setEnabled(state not in (AppState.STARTING, AppState.STOPPING, AppState.ERROR))
        self.refresh_swarm()
        self.pause_action.blockSignals(True)
        self.pause_action.setChecked(not self.host.contributing)
        self.pause_action.blockSignals(False)

    def refresh_swarm(self, *_args) -> None:
        """The swarm line: "Swarm: 1a2b3c4d (private)" or "Swarm: open"."""
        node = self.host.node
        if node.peers is None:
            self.swarm_action.setText("Swarm: peer network off")
            for action in (self.invite_action, self.join_action):
                action.setEnabled(False)
            return
        st = node.swarm_status()
        self.swarm_action.setText("Swarm: open" if st["open"] else f"Swarm: {st['swarm']} (private)")
        self.invite_action.setEnabled(not st["open"])
        self.join_action.setEnabled(True)

    def _balloon(self, text: str) -> None:
        if self.icon.isVisible() and QSystemTrayIcon.supportsMessages():
            self.icon.showMessage("SwarmLLM", text, QSystemTrayIcon.MessageIcon.Information, 3000)

    def show(self) -> None:
        self.icon.show()

    def hide(self) -> None:
        self.icon.hide()
