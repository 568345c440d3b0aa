"""The main window: Overview, Swarm, Chat, Peers, Models, Requests and Diagnostics tabs over
NodeFeeds. Its size, place, tab and appearance (system / light / dark: the status bar's Appearance button) are kept in the data dir's
window.ini and restored on the next open; Alt+1…7 switch tabs."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QSettings
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QHideEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import QApplication, QMainWindow, QMenu, QTabWidget, QToolButton

from app.actions import AppActions
from app.host import NodeHost
from app.icons import state_icon
from app.ui import palette
from app.ui.chat_tab import ChatTab
from app.ui.diagnostics_tab import DiagnosticsTab
from app.ui.feeds import NodeFeeds
from app.ui.models_tab import ModelsTab
from app.ui.overview_tab import OverviewTab
from app.ui.peers_tab import PeersTab
from app.ui.requests_tab import RequestsTab
from app.ui.swarm_tab import SwarmTab
from app.ui.widgets import ElidedLabel

TAB_NAMES = ("Overview", "Swarm", "Chat", "Peers", "Models", "Requests", "Diagnostics")
SETTINGS_FILE = "window.ini"
DEFAULT_SIZE = (1120, 720)


class MainWindow(QMainWindow):
    """Closing it hides it while a tray icon keeps the app reachable; otherwise it quits."""

    def __init__(self, host: NodeHost, feeds: NodeFeeds, actions: AppActions, *,
                 tray_available: bool, on_quit: Callable[[], None]):
        super().__init__()
        self.host = host
        self.tray_available = tray_available
        self._on_quit = on_quit
        self.setWindowTitle("SwarmLLM")
        self.resize(*DEFAULT_SIZE)
        self.settings = QSettings(str(host.node.data_dir / SETTINGS_FILE), QSettings.Format.IniFormat)
        scheme = self.settings.value("appearance", "system")
        # before any widget exists: a style change later re-polishes every widget (0.2-0.4 s)
        palette.apply(QApplication.instance(), scheme if scheme in palette.SCHEMES else "system")
        self.tabs = QTabWidget()
        self.overview_tab = OverviewTab(host, feeds.overview, feeds.requests)
        self.swarm_tab = SwarmTab(host, feeds.layer_map, feeds.rates)
        self.chat_tab = ChatTab(host)
        self.peers_tab = PeersTab(host, feeds.peers)
        self.models_tab = ModelsTab(host, feeds.models)
        self.requests_tab = RequestsTab(feeds.requests)
        self.diagnostics_tab = DiagnosticsTab(actions)
        for i, (name, tab) in enumerate(zip(TAB_NAMES, (self.overview_tab, self.swarm_tab, self.chat_tab,
                                                        self.peers_tab, self.models_tab, self.requests_tab,
                                                        self.diagnostics_tab), strict=True)):
            self.tabs.addTab(tab, name)
            self.tabs.setTabToolTip(i, f"{name} (Alt+{i + 1})")
            QShortcut(QKeySequence(f"Alt+{i + 1}"), self, activated=lambda i=i: self.tabs.setCurrentIndex(i))
        feeds.swarm_changed.connect(self.swarm_tab.contribute.refresh)
        feeds.swarm_changed.connect(self.swarm_tab.sync_picker)
        feeds.swarm_changed.connect(self.chat_tab.schedule_refresh)
        host.started.connect(self.chat_tab.refresh_models)
        self._appearance_menu()
        # The overview's banner buttons act like the Models tab's.
        self.overview_tab.banner.add_model_clicked.connect(self.models_tab.choose_model_file)
        self.overview_tab.banner.open_folder_clicked.connect(self.models_tab.open_models_folder)
        self.models_tab.folder_timer.timeout.connect(self.overview_tab.banner.update_from_host)
        self.setCentralWidget(self.tabs)
        self.state_label = ElidedLabel()  # counts, elided at the window's edge; the whole list in its tooltip
        self.statusBar().addWidget(self.state_label, 1)  # (not permanent: a message shows in its place)
        actions.message.connect(lambda text: self.statusBar().showMessage(text, 6000))
        host.state_changed.connect(self._on_state)
        self._on_state()
        self.restore_state()

    # --- kept between runs ---

    def _appearance_menu(self) -> None:
        """System colours / Light / Dark, from a button in the status bar (a QMenuBar would cost
        ~0.2 s of start-up on Linux looking for a desktop's global menu, for one menu)."""
        menu = QMenu(self)
        group = QActionGroup(self)
        self.appearance_actions: dict[str, QAction] = {}
        for scheme, words in (("system", "&System colours"), ("light", "&Light"), ("dark", "&Dark")):
            action = QAction(words, self, checkable=True)
            action.triggered.connect(lambda _checked, scheme=scheme: self.set_appearance(scheme))
            group.addAction(action)
            menu.addAction(action)
            self.appearance_actions[scheme] = action
        self.appearance_button = QToolButton()
        self.appearance_button.setText("Appearance")
        self.appearance_button.setToolTip("Colours of the window: the system's, light or dark")
        self.appearance_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.appearance_button.setMenu(menu)
        self.statusBar().addPermanentWidget(self.appearance_button)

    def set_appearance(self, scheme: str) -> None:
        palette.apply(QApplication.instance(), scheme)
        self.appearance_actions[scheme].setChecked(True)
        self.settings.setValue("appearance", scheme)

    def restore_state(self) -> None:
        """Size, place, tab and appearance as the window last had them (defaults the first time)."""
        geometry = self.settings.value("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        tab = self.settings.value("tab")
        if tab in TAB_NAMES:
            self.show_tab(tab)
        scheme = self.settings.value("appearance", "system")
        self.set_appearance(scheme if scheme in palette.SCHEMES else "system")

    def save_state(self) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("tab", TAB_NAMES[self.tabs.currentIndex()])
        self.settings.sync()

    def hideEvent(self, event: QHideEvent) -> None:
        self.save_state()
        super().hideEvent(event)

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
        text, full = self.host.status_brief()
        self.state_label.set_full_text(text)
        self.state_label.setToolTip(full)
        short = self.host.node.short_id
        self.setWindowTitle(f"SwarmLLM — node {short}" if short else "SwarmLLM")

    def closeEvent(self, event: QCloseEvent) -> None:
        self.save_state()
        if self.tray_available:
            event.ignore()  # the tray keeps the node running; Quit is in its menu
            self.hide()
        else:
            event.accept()
            self._on_quit()
