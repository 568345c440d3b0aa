"""The peers table and its adapter to the peer network's snapshot + observer API.

The peer network (node.net.PeerManager) offers `peers()`, a list of frozen `PeerSnapshot`s
(`node_id, short_id, state, transport, address, rtt_ms, models, last_seen, hardware, via_relay,
...`), and `subscribe(callback)` with callback(kind, snapshot), kind in added/changed/removed.
Addresses are redacted (the same tags as the diagnostics report) unless "Show addresses" is ticked.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import Qt

from app.ui import fmt
from app.ui.table_model import Column, KeyedTableModel
from node.redact import Redactor

if TYPE_CHECKING:
    from node.net import PeerManager

log = logging.getLogger(__name__)

# refused peers that never linked shown as rows, the most recent: anyone who can reach the peer port
# can be refused under fresh identities (the node remembers up to MAX_REFUSALS of them)
REFUSED_ROWS_MAX = 20


def _plain(text: str | None) -> str | None:
    """A tooltip of text a peer wrote, shown as the text it is: Qt renders a tooltip that looks like
    HTML as rich text (escaped into a rich-text paragraph, newlines kept)."""
    return Qt.convertFromPlainText(text, Qt.WhiteSpaceMode.WhiteSpaceNormal) if text else None  # (wraps)


def peer_dict(item: Any) -> dict[str, Any]:
    """A peer snapshot (dataclass with as_dict, or a mapping) as a plain dict."""
    if hasattr(item, "as_dict"):
        return dict(item.as_dict())
    if isinstance(item, Mapping):
        return dict(item)
    return dict(vars(item))


def split_address(address: str) -> tuple[str, int | None]:
    """'host:port' / '[v6]:port' / 'host' → (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if address.count(":") == 1:
        host, _, port = address.partition(":")
        return host, int(port) if port.isdigit() else None
    return address, None


def _model_text(m: Mapping[str, Any]) -> str:
    """'name [0–11 of 22]' for a slice (HELLO: start/end, end exclusive), 'name [whole]'."""
    name = str(m.get("name") or m.get("id") or m.get("model") or str(m.get("sha256", "?"))[:12])
    held = m.get("layers") or m.get("layers_held")
    if held is None and "start" in m and "end" in m:
        held = [m.get("start"), m.get("end")]
    total = m.get("n_layers")
    if held is not None:
        return f"{name} [{fmt.layers(held, total)}]"
    return f"{name} [whole]" if m.get("whole") else name


def _number(value: object) -> float | None:
    """A peer's figure if it is a finite number (its HELLO is any JSON: a string beside a number made
    `min` raise in the cell at every repaint, 2026-12-07)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)  # (an integer of hundreds of digits: OverflowError, review r61)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _ms_per_layer(p: Mapping[str, Any]) -> float | None:
    hw = p.get("hardware") or {}
    value = _number(hw.get("ms_per_layer")) if isinstance(hw, Mapping) else None
    if value is None:
        values = [v for m in p.get("models") or () if isinstance(m, Mapping)
                  and (v := _number(m.get("ms_per_layer"))) is not None]
        value = min(values) if values else None
    return value


def _link(p: Mapping[str, Any]) -> str:
    transport = p.get("transport")
    if not transport:
        return fmt.DASH
    return "relayed" if transport == "relayed" else "direct"


class PeersModel(KeyedTableModel):
    """One row per peer, keyed by node id."""

    def __init__(self, parent=None):
        self.show_addresses = False
        self._salt = secrets.token_bytes(16)  # one tag per host for the life of the window
        columns = [
            Column("Peer", lambda p: p.get("short_id") or str(p.get("node_id", ""))[:8],
                   tooltip=lambda p: _plain(f"{p.get('node_id')}\n{p.get('agent') or ''}".strip()),
                   header_tip="the peer's node id, first 8 digits (hover a row for all of it)"),
            Column("State", lambda p: p.get("state") or fmt.DASH,
                   color=lambda p: fmt.STATE_COLORS.get(p.get("state") or ""),
                   tooltip=lambda p: _plain(p.get("last_error")), header_tip="connected, connecting or gone (hover for the last error)"),
            Column("Address", self._address, header_tip="redacted unless “Show addresses” is ticked"),
            Column("Link", _link, tooltip=lambda p: self._via(p),
                   header_tip="direct TLS link, or relayed through another node"),
            Column("RTT", lambda p: fmt.ms(p.get("rtt_ms")), numeric=True, header_tip="round-trip time of the link's pings"),
            Column("Models and layers", lambda p: "; ".join(_model_text(m) for m in p.get("models") or ())
                   or fmt.DASH, header_tip="what the peer serves: layer ranges of models, or models whole"),
            Column("ms/layer", lambda p: fmt.ms(_ms_per_layer(p)), numeric=True,
                   header_tip="measured per-layer compute time the peer advertises"),
            Column("Last seen", lambda p: fmt.ago(p.get("last_seen")), header_tip="when the last message from the peer arrived"),
        ]
        super().__init__(columns, parent=parent)
        self._unsubscribe: Callable[[], None] | None = None
        self._peers: PeerManager | None = None
        self._refused_only: set[str] = set()  # rows of refused peers the peer table has no record of
        # "Last seen" ages without events: re-render that column (no node access) every few seconds.
        self._ager = QTimer(self)
        self._ager.setInterval(5000)
        self._ager.timeout.connect(self._age)
        self._ager.start()

    # --- addresses ---

    def _redactor(self) -> Redactor:
        return Redactor(enabled=not self.show_addresses, salt=self._salt)

    def _address(self, p: Mapping[str, Any]) -> str:
        address = p.get("address")
        if not address:
            return fmt.DASH
        host, port = split_address(str(address))
        return self._redactor().address(host, port)

    def address_of(self, node_id: str) -> str:
        """A peer's address as this table shows it (redacted unless "Show addresses")."""
        p = self.value(node_id)
        return self._address(p) if p is not None else fmt.DASH

    def _via(self, p: Mapping[str, Any]) -> str | None:
        relay = p.get("via_relay")
        if not relay:
            return None
        host, port = split_address(str(relay))
        return f"via relay {self._redactor().address(host, port)}"

    def set_show_addresses(self, on: bool) -> None:
        """Tick/untick "Show addresses"."""
        self.show_addresses = bool(on)
        if self.rowCount():
            self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, self.columnCount() - 1))

    def _age(self) -> None:
        self._sync_refused()
        if self.rowCount():
            col = self.columnCount() - 1
            self.dataChanged.emit(self.index(0, col), self.index(self.rowCount() - 1, col))

    # --- feeding ---

    def on_peer_event(self, kind: str, snapshot: Any) -> None:
        """Peer observer: kind is added / changed / removed."""
        p = peer_dict(snapshot)
        key = p.get("node_id")
        if not key:
            return
        self._refused_only.discard(key)  # the peer table's own row from now on
        if kind == "removed":
            self.remove(key)
        else:
            self.upsert(key, p)

    def attach(self, peers: PeerManager | None) -> None:
        """Show the peer network's current snapshot and follow its observer events."""
        self.detach()
        if peers is None:
            return
        rows = [peer_dict(item) for item in peers.peers()]
        self.replace_all((p["node_id"], p) for p in rows)
        self._refused_only.clear()
        self._unsubscribe = peers.subscribe(self.on_peer_event)
        self._peers = peers
        self._sync_refused()

    def detach(self) -> None:
        self._peers = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _sync_refused(self) -> None:
        """A row for each refused peer that never linked (the peer table has no record of it, so it
        had no row: only the "Refused" label above the table named it), its reason and what to do
        in the State column's tooltip: a friend invited, whose node is not here, shows why (2026-12-06).
        At most REFUSED_ROWS_MAX rows, the most recent; the reason (a peer's own text, one line and
        capped by the node) shows as plain text.
        Read with the "Last seen" ageing (every 5 s) and on attach."""
        refused = self._peers.swarm_ops.status()["refused"] if self._peers is not None else []
        wanted: dict[str, dict[str, Any]] = {}
        rows = [r for r in refused if r["node_id"] in self._refused_only or self.value(r["node_id"]) is None]
        for r in rows[-REFUSED_ROWS_MAX:]:  # the most recent (anyone who reaches the port can be refused)
            wanted[r["node_id"]] = {"node_id": r["node_id"], "short_id": r["peer"], "state": "refused",
                                    "last_error": r.get("error") or r["reason"],
                                    "last_seen": time.time() - float(r["last_s_ago"])}
        for key in self._refused_only - wanted.keys():
            self.remove(key)
        for key, row in wanted.items():
            if self.value(key) != row:
                self.upsert(key, row)
        self._refused_only = set(wanted)
