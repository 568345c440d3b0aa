"""The main window: Overview, Peers, Models, Requests and Diagnostics tabs over NodeFeeds."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QLabel, QMainWindow, QTabWidget

from app.actions import AppActions
from app.host import NodeHost
from app.icons import state_icon
from app.ui.diagnostics_tab import DiagnosticsTab
from app.ui.feeds import NodeFeeds
from app.ui.models_tab import ModelsTab
from app.ui.overview_tab import OverviewTab
from app.ui.peers_tab import PeersTab
from app.ui.requests_tab import RequestsTab

TAB_NAMES = ("Overview", "Peers", "Models", "Requests", "Diagnostics")


class MainWindow(QMainWindow):
    """Closing it hides it while a tray icon keeps the app reachable; otherwise it quits."""

    def __init__(self, host: NodeHost, feeds: NodeFeeds, actions: AppActions, *,
                 tray_available: bool, on_quit: Callable[[], None]):
        super().__init__()
        self.host = host
        self.tray_available = tray_available
        self._on_quit = on_quit
        self.setWindowTitle("SwarmLLM")
        self.resize(1040, 640)
        self.tabs = QTabWidget()
        self.overview_tab = OverviewTab(host, feeds.overview, feeds.requests)
        self.peers_tab = PeersTab(host, feeds.peers)
        self.models_tab = ModelsTab(host, feeds.models)
        self.requests_tab = RequestsTab(feeds.requests)
        self.diagnostics_tab = DiagnosticsTab(actions)
        for name, tab in zip(TAB_NAMES, (self.overview_tab, self.peers_tab, self.models_tab,
                                         self.requests_tab, self.diagnostics_tab), strict=True):
            self.tabs.addTab(tab, name)
        # The overview's banner buttons act like the Models tab's.
        self.overview_tab.banner.add_model_clicked.connect(self.models_tab.choose_model_file)
        self.overview_tab.banner.open_folder_clicked.connect(self.models_tab.open_models_folder)
        self.setCentralWidget(self.tabs)
        self.state_label = QLabel()
        self.statusBar().addPermanentWidget(self.state_label)
        actions.message.connect(lambda text: self.statusBar().showMessage(text, 6000))
        host.state_changed.connect(self._on_state)
        self._on_state()

    def show_tab(self, name: str) -> None:
        self.tabs.setCurrentIndex(TAB_NAMES.index(name))

    def bring_up(self) -> None:
        """Show, un-minimise and raise (the tray's Open)."""
        self.show()
        self.setWindowState(self.windowState() & ~self.windowState().WindowMinimized)
        self.raise_()
        self.activateWindow()

    def _on_state(self, *_args) -> None:
        self.setWindowIcon(state_icon(self.host.state))
        self.state_label.setText(self.host.status_line())
        short = self.host.node.short_id
        self.setWindowTitle(f"SwarmLLM — node {short}" if short else "SwarmLLM")

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.tray_available:
            event.ignore()  # the tray keeps the node running; Quit is in its menu
            self.hide()
        else:
            event.accept()
            self._on_quit()
