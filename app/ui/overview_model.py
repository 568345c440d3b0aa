"""The overview: a two-column table (what, value) kept current from node events.

Inputs: the host's state signal, model observer events, trace observer events and the peers
table's row count. Requests/min is counted from "finished" trace events over the last minute.
"""

from __future__ import annotations

import collections
import time

from PySide6.QtCore import QTimer

from app.host import STATE_WORDS, NodeHost
from app.ui import fmt
from app.ui.table_model import Column, KeyedTableModel
from node.trace import RequestTrace

RATE_WINDOW_S = 60.0
TOK_S_SAMPLES = 10  # tok/s is the mean of the last N finished requests that measured it

ROWS = ("Node", "State", "API URL", "Served models", "Requests/min", "tok/s", "In flight", "Peers",
        "Contributing")

OVERVIEW_COLUMNS = [
    Column("What", lambda r: r[0], header_tip="what is shown"),
    Column("Value", lambda r: r[1], tooltip=lambda r: r[2], header_tip="its value now (hover a value for more)"),
]


class OverviewModel(KeyedTableModel):
    """Rows keyed by label; values are (label, text, tooltip)."""

    def __init__(self, parent=None):
        super().__init__(OVERVIEW_COLUMNS, parent=parent)
        self.replace_all((label, (label, fmt.DASH, None)) for label in ROWS)
        self._finished_at: collections.deque[float] = collections.deque()
        self._rates: collections.deque[float] = collections.deque(maxlen=TOK_S_SAMPLES)
        self._in_flight: set[str] = set()
        self._ager = QTimer(self)  # the per-minute count decays without events
        self._ager.setInterval(5000)
        self._ager.timeout.connect(self._update_rate)
        self._ager.start()

    def set_value(self, label: str, text: str, tooltip: str | None = None) -> None:
        """Change one row (no signal if nothing changed)."""
        current = self.value(label)
        if current is not None and current[1:] == (text, tooltip):
            return
        self.upsert(label, (label, text, tooltip))

    def text(self, label: str) -> str | None:
        row = self.value(label)
        return row[1] if row else None

    # --- feeds ---

    def on_host_state(self, host: NodeHost) -> None:
        node = host.node
        self.set_value("Node", node.short_id or fmt.DASH, node.node_id or None)
        self.set_value("State", STATE_WORDS[host.state], host.status_line())
        self.set_value("API URL", node.api_url if host.is_started else fmt.DASH,
                       "point OpenAI clients here; the API key is in the tray menu")
        self.set_value("Contributing", "yes" if host.contributing else "paused",
                       "serving work for peers (the tray's “Pause contributing” switch)")
        self.on_models(host)

    def on_models(self, host: NodeHost) -> None:
        now = host.serving()
        whole = host.node.models.whole_models()
        text = f"{len(now.whole_loaded)} loaded of {len(whole)}"
        if now.whole_loaded or now.slices_loaded or now.swarm:
            text += f": {now.describe()}"
        self.set_value("Served models", text, "whole models run here; layer slices serve the swarm; "
                       "“via peers” models are covered layer by layer by this node and its peers")

    def on_trace_event(self, event: str, trace: RequestTrace) -> None:
        if event == "started":
            self._in_flight.add(trace.request_id)
        elif event == "finished":
            self._in_flight.discard(trace.request_id)
            self._finished_at.append(time.monotonic())
            if trace.tok_per_sec is not None:
                self._rates.append(trace.tok_per_sec)
            rate = sum(self._rates) / len(self._rates) if self._rates else None
            self.set_value("tok/s", fmt.rate(rate), f"mean of the last {len(self._rates)} requests")
            self._update_rate()
        self.set_value("In flight", str(len(self._in_flight)))

    def on_peer_count(self, connected: int, known: int, network_on: bool, *, starting: bool = False) -> None:
        if not network_on:  # (not up yet while the node starts: "off" there was untrue)
            self.set_value("Peers", "— (starting)" if starting else "0 (peer network off)")
        else:
            self.set_value("Peers", f"{connected} connected" + (f" ({known} known)" if known != connected else ""))

    def _update_rate(self) -> None:
        cutoff = time.monotonic() - RATE_WINDOW_S
        while self._finished_at and self._finished_at[0] < cutoff:
            self._finished_at.popleft()
        self.set_value("Requests/min", str(len(self._finished_at)), "requests finished in the last 60 s")
