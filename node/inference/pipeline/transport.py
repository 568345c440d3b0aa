"""How pipeline frames travel: over peer links, or straight to this node's own worker/coordinator.

A hop to this node itself never touches a socket: the frame's content is handed to the local
handler on the next loop iteration (so ordering is the same as for remote hops). Sends are
synchronous (`send_nowait`) so frames leave in the order they were produced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from node.errors import PeerUnreachable
from node.net import Frame, FrameType

log = logging.getLogger(__name__)

LocalHandler = Callable[[dict[str, Any], bytes, str], None]


class PipelineTransport:
    """Send WORK/ACK/RESULT/CANCEL/SESSION_END to a node id, local or remote."""

    def __init__(self, node_id: str, peers: Any | None):
        self.node_id = node_id
        self.peers = peers
        self._local: dict[int, LocalHandler] = {}

    def on_local(self, frame_type: int, handler: LocalHandler) -> None:
        """Where frames addressed to this node go (header, payload, sender node id)."""
        self._local[int(frame_type)] = handler

    def kind(self, node_id: str) -> str:
        """local | direct | relayed: how a hop to node_id travels."""
        if node_id == self.node_id:
            return "local"
        if self.peers is None:
            return "unreachable"
        snap = self.peers.peer(node_id)
        return getattr(snap, "transport", "direct") if snap is not None else "unreachable"

    def send(self, node_id: str, frame_type: FrameType, header: dict[str, Any], payload: bytes = b"") -> int:
        """Send now (never blocks); returns bytes put on the wire (0 for a local hop)."""
        if node_id == self.node_id:
            handler = self._local.get(int(frame_type))
            if handler is None:
                raise PeerUnreachable(f"no local handler for {frame_type.name}")
            asyncio.get_running_loop().call_soon(handler, header, payload, self.node_id)
            return 0
        link = self.peers.link(node_id) if self.peers is not None else None
        if link is None:
            raise PeerUnreachable(f"no link to peer {node_id[:8]}")
        link.send_nowait(Frame(frame_type, header, payload))
        return len(payload)

    def unsent(self, node_id: str) -> int:
        """Bytes queued toward node_id that have not left this machine yet (0 for this node)."""
        if node_id == self.node_id or self.peers is None:
            return 0
        link = self.peers.link(node_id)
        return link.unsent if link is not None else 0

    def send_many(self, node_id: str, frames: list[tuple[FrameType, dict[str, Any], bytes]]) -> None:
        """Send several frames to one node, in order, as one write (never blocks)."""
        if node_id == self.node_id:
            for frame_type, header, payload in frames:
                self.send(node_id, frame_type, header, payload)
            return
        link = self.peers.link(node_id) if self.peers is not None else None
        if link is None:
            raise PeerUnreachable(f"no link to peer {node_id[:8]}")
        link.send_many_nowait([Frame(ftype, header, payload) for ftype, header, payload in frames])

    def register_remote(self, frame_type: FrameType) -> None:
        """Serve frames of this type arriving from peers with the local handler (in link order)."""
        if self.peers is None:
            return
        handler = self._local[int(frame_type)]

        def on_frame(link, frame: Frame) -> None:
            # A plain function runs inline as the frame is parsed: arrival order, no task per frame.
            handler(frame.header, frame.payload, link.node_id)

        self.peers.register_handler(frame_type, on_frame)
