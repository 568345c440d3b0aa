"""What the API and the tray ask of the node's swarm (Node's part): status, invite, join, leave,
remove a member, the peer rows; each change noted in the report's recent activity."""

from __future__ import annotations

from typing import Any

from node.errors import Conflict


class SwarmActions:
    """Mixed into Node: needs its `peers` (PeerManager or None) and `note_activity`."""

    peers: Any
    swarm_events: Any  # Node's Observers: a join, leave or remove ended (the app's swarm lines; review r62:
    # one made through the admin API or the CLI left them naming the old swarm)

    def note_activity(self, text: str) -> None:  # Node's
        raise NotImplementedError

    def _swarm(self):
        if self.peers is None:
            raise Conflict("the peer network is not running")
        return self.peers.swarm_ops

    def swarm_status(self) -> dict[str, Any]:
        """This node's swarm (never the secret or an invite code)."""
        return self._swarm().status()

    async def async_invite(self, ttl_s: float = 24 * 3600.0) -> tuple[str, float]:
        """A one-time invite code (shown to the user only) and when it expires."""
        code, expires_at = await self._swarm().async_invite(ttl_s)
        self.note_activity("invite created")
        return code, expires_at

    async def async_join(self, code: str) -> str:
        """Join the swarm of the node that made the code."""
        try:
            swarm = await self._swarm().async_join(code)
        finally:
            self.swarm_events.emit()
        self.note_activity(f"joined swarm {swarm}")
        return swarm

    async def async_leave(self) -> str:
        """Leave the swarm (a new private one of this node alone)."""
        try:
            swarm = await self._swarm().async_leave()
        finally:
            self.swarm_events.emit()
        self.note_activity(f"left the swarm; now alone in {swarm}")
        return swarm

    async def async_remove_member(self, node_id: str) -> int:
        """Remove a member and rotate the swarm secret."""
        try:
            told = await self._swarm().async_remove(node_id)
        finally:
            self.swarm_events.emit()
        self.note_activity(f"removed {node_id[:8]} from the swarm")
        return told

    def peer_rows(self) -> list[dict[str, Any]]:
        """The peer table as JSON rows ([] when the peer network is off)."""
        return [p.as_dict() for p in self.peers.peers()] if self.peers is not None else []

    def refused_rows(self) -> list[dict[str, Any]]:
        """The peers refused for not being in this swarm, with what to do (swarm status's rows)."""
        return self.peers.swarm_ops.status()["refused"] if self.peers is not None else []
