"""NodeFeeds: the app's Qt table models and their subscriptions to node observers.

This is the only place node observer APIs meet Qt models: trace events feed the requests and
overview tables, model events the models table, peer events the peers table, and the host's state
signal the overview. Observers run on the loop thread, which under qasync is the Qt thread, so
the models are updated directly. Widgets only ever see the Qt models.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.host import AppState, NodeHost
from app.ui.models_model import ModelsModel
from app.ui.overview_model import OverviewModel
from app.ui.peers_model import PeersModel
from app.ui.requests_model import RequestsModel
from app.ui.swarm_model import LayerMapModel, RateSeries, build_maps
from node.node import Node


def slice_rows(node: Node) -> dict[str, dict]:
    """Models-table rows for the layer slices the node serves (catalog facts + slice state)."""
    rows = {}
    for hosted in node.slice_host.slices.values():
        row = {**hosted.entry.summary(), **hosted.summary()}
        rows[f"{hosted.entry.id}@{hosted.start}-{hosted.end}"] = row
    return rows


class NodeFeeds(QObject):
    """Owns one table model per collection, fed by node events."""

    swarm_changed = Signal()  # the layer map or a contribution changed (the Swarm tab's panel re-reads)

    def __init__(self, host: NodeHost, parent: QObject | None = None):
        super().__init__(parent)
        self.host = host
        node = host.node
        self.requests = RequestsModel(self)
        self.models = ModelsModel(self)
        self.peers = PeersModel(self)
        self.overview = OverviewModel(self)
        self.layer_map = LayerMapModel(self)
        self.rates = RateSeries()
        self._last_chains: dict[str, object] = {}  # model id -> its last finished request that ran on a chain
        self._unsubscribers: list[Callable[[], None]] = [
            node.traces.subscribe(self.requests.on_trace_event),
            node.traces.subscribe(self.overview.on_trace_event),
            node.traces.subscribe(self._on_trace),
            node.models.subscribe(self.models.on_model_event),
            node.models.subscribe(lambda _event, _served: self._on_models_changed()),
            node.slice_host.subscribe(lambda _hosted: self._on_models_changed()),  # loads, moves, fetch progress
            node.contributions.events.subscribe(self._on_swarm_changed),
        ]
        for served in node.models.all():  # models registered before we subscribed
            self.models.on_model_event("added", served)
        host.state_changed.connect(self._on_state)
        host.started.connect(self._on_started)
        self.peers.rowsInserted.connect(self._on_peer_count)
        self.peers.rowsRemoved.connect(self._on_peer_count)
        self.peers.modelReset.connect(self._on_peer_count)
        self.peers.dataChanged.connect(self._on_peer_count)  # a peer's state changed
        self._on_state()
        self._on_peer_count()

    def _on_state(self, *_args) -> None:
        self.overview.on_host_state(self.host)
        self._on_peer_count()  # (a failed start leaves STARTING without a `started`: not "starting" for good)

    def _on_started(self) -> None:
        self.peers.attach(self.host.node.peers)
        if self.host.node.peers is not None:
            self._unsubscribers.append(self.host.node.peers.subscribe(lambda _kind, _snap: self._on_swarm_changed()))
        self._on_peer_count()
        self._on_models_changed()

    def _on_trace(self, event: str, trace) -> None:
        if event != "finished":
            return
        self.rates.add(time.time(), trace.completion_tokens)
        if trace.outcome == "ok" and len([s for s in trace.segments if s.layer_end > s.layer_start]) > 0 \
                and trace.route != "local":
            self._last_chains[trace.model] = trace
            self._on_swarm_changed()

    def _on_swarm_changed(self) -> None:
        """Peers' adverts, this node's slices, a chain or a contribution changed: redraw the map."""
        node = self.host.node
        if not self.host.is_started:
            return
        fetches = {h.key: h.fetch for h in node.slice_host.slices.values() if h.fetch is not None}
        ids = {e.sha256: e.id for e in node.catalog.entries.values()}
        self.layer_map.set_maps(build_maps(node.node_id, node.advertised_models(),
                                           node.peers.peers() if node.peers is not None else [], ids,
                                           self._last_chains, fetches, self.peers.address_of))
        self.swarm_changed.emit()

    def _on_models_changed(self) -> None:
        # Slice rows are read when the node says models changed, when it has started, and on
        # every slice host event (a load, a move, a partial model's layers arriving).
        self.models.set_slices(slice_rows(self.host.node))
        self.overview.on_models(self.host)
        self._on_swarm_changed()

    def _on_peer_count(self, *_args) -> None:
        rows = self.peers.values()
        connected = sum(1 for p in rows if p.get("state") == "connected")
        self.overview.on_peer_count(connected, len(rows), self.host.node.peers is not None,
                                    starting=self.host.state == AppState.STARTING)

    def detach(self) -> None:
        """Stop following the node (shutdown)."""
        for unsubscribe in self._unsubscribers:
            unsubscribe()
        self._unsubscribers.clear()
        self.peers.detach()
        try:
            self.host.state_changed.disconnect(self._on_state)
            self.host.started.disconnect(self._on_started)
        except (RuntimeError, TypeError):  # already disconnected
            pass
