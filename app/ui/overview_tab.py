"""Overview tab: who this node is, where to point clients, and how busy it is."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHeaderView,
    QLabel,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.host import NodeHost
from app.ui.overview_model import OverviewModel
from app.ui.requests_model import RequestsModel
from app.ui.widgets import FirstRunBanner, table_view

HOW_TO = ("Point any OpenAI-compatible client at the API URL with the API key (tray menu → Copy API "
          "key), e.g. <tt>OpenAI(base_url=URL, api_key=KEY)</tt>. When asking for help, paste "
          "“Copy diagnostics”: it is redacted and safe to share.")


class OverviewTab(QWidget):
    """The first-run banner (when needed) above a two-column summary table."""

    def __init__(self, host: NodeHost, model: OverviewModel, requests: RequestsModel,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.banner = FirstRunBanner(host)
        self.view = table_view(model)
        self.view.horizontalHeader().setVisible(False)
        self.view.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.view.setShowGrid(False)
        self.view.setAlternatingRowColors(False)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        rows = model.rowCount()
        self.view.setFixedHeight(rows * self.view.verticalHeader().defaultSectionSize() + 6)
        # The same live requests model as the Requests tab, a second view on it.
        self.recent = table_view(requests)
        self.recent_label = QLabel("<b>Recent requests</b> (details in the Requests tab)")
        self.hint = QLabel(HOW_TO)
        self.hint.setWordWrap(True)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.addWidget(self.banner)
        layout.addWidget(self.view)
        layout.addWidget(self.recent_label)
        layout.addWidget(self.recent, 1)
        layout.addWidget(self.hint)
        # Scrolled when the window is too small for it: the window's minimum height reckons the
        # banner's wrapped lines at another width, and Qt then drew "Recent requests" over the
        # summary's last rows (a start error on two lines in a window at its minimum)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
