"""What the servers of peers' requests for a model held whole here share (remote generate,
`remote_serve.RemoteGenerateServer`; remote embeddings, `embed_serve.RemoteEmbedServer`): the two
frames each answers (a request and its cancel), the jobs running by (asker, sid), stopping an
asker's jobs when its link drops, and stopping them all when the node stops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.inference.manager import ModelManager
from node.inference.pipeline.transport import PipelineTransport
from node.net import FrameType


class PeerRequestServer:
    """A base: subclasses name REQUEST and CANCEL and define on_request, on_cancel and _stop."""

    REQUEST: FrameType
    CANCEL: FrameType

    def __init__(self, node_id: str, models: ModelManager, transport: PipelineTransport, peers: Any | None,
                 contributing: Callable[[], bool] = lambda: True):
        self.node_id = node_id
        self.models = models
        self.transport = transport
        self.peers = peers  # PeerManager: link drops (observer); None without a peer network
        self.contributing = contributing  # False: "Pause contributing" — refuse work for other nodes
        self.running: dict[tuple[str, str], Any] = {}  # (asker, sid) -> its job
        self.served = 0  # requests completed for others
        self._unsubscribe: Callable[[], None] | None = None
        transport.on_local(self.REQUEST, self.on_request)
        transport.on_local(self.CANCEL, self.on_cancel)

    def on_request(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        raise NotImplementedError

    def on_cancel(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        raise NotImplementedError

    def _stop(self, job: Any, why: str) -> None:
        raise NotImplementedError

    def register(self) -> None:
        """Serve these frames from peers; watch the askers' links."""
        for ftype in (self.REQUEST, self.CANCEL):
            self.transport.register_remote(ftype)
        if self.peers is not None:
            self._unsubscribe = self.peers.subscribe(self._on_peer_event)

    def close(self) -> None:
        """Stop watching links and stop every job."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for job in list(self.running.values()):
            self._stop(job, "node stopping")

    @property
    def in_flight(self) -> int:
        """Jobs running (or queued) here for other nodes."""
        return len(self.running)

    def _on_peer_event(self, kind: str, snap: Any) -> None:
        if kind == "removed" or snap.state != "connected":
            for (asker, _sid), job in list(self.running.items()):
                if asker == snap.node_id:
                    self._stop(job, f"link to the coordinator dropped ({snap.state})")
