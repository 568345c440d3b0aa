"""ControlFrames: what a live link's frames go to once they are neither replies nor PINGs.

Registered handlers (WORK, ACK, RESULT, ...) first; then the network's own frames: a HELLO update,
PEX, MEMBER, RELAY and ERROR (`unsupported_frame_type` remembered by `_lacks.py`). Any other type
is refused with ERROR `unsupported_frame_type`, the link stays. The manager builds one and hands
its `dispatch` to every `PeerLink`.
"""

from __future__ import annotations

from node.errors import ProtocolError

from ._discovery import Discovery
from ._frames import Frame, FrameType
from ._handlers import Handlers
from ._lacks import PeerLacks, refuse_unsupported
from ._link import PeerLink
from ._messages import Hello
from ._relay import RelayService
from ._swarmops import SwarmOps
from ._table import PeerTable

# the types the network serves itself: no handler may be registered for them
RESERVED = frozenset({FrameType.HELLO, FrameType.ERROR, FrameType.PING, FrameType.PONG, FrameType.PEX,
                      FrameType.RELAY, FrameType.MEMBER})


class ControlFrames:
    """Dispatches a link's frames to the handlers and the network's parts."""

    def __init__(self, handlers: Handlers, table: PeerTable, discovery: Discovery, swarm_ops: SwarmOps,
                 relay: RelayService | None, lacks: PeerLacks) -> None:
        self._handlers = handlers
        self._table = table
        self._discovery = discovery
        self._swarm_ops = swarm_ops
        self._relay = relay
        self._lacks = lacks

    def dispatch(self, link: PeerLink, frame: Frame) -> None:
        """Frames that are not responses or PINGs. A ProtocolError here closes that link."""
        ftype = frame.type
        if self._handlers.dispatch(link, frame):  # the hot path first: WORK/ACK/RESULT...
            return
        if ftype == FrameType.HELLO:
            hello = Hello.from_frame(frame)
            if hello.node_id != link.node_id:
                raise ProtocolError("HELLO update claims another node id")
            link.hello = hello
            rec = self._table.get(link.node_id)
            if rec is not None and rec.link is link:
                rec.hello = hello
                self._table.emit_changed(rec)
        elif ftype == FrameType.PEX:
            self._discovery.handle_pex(link, frame)
        elif ftype == FrameType.MEMBER:
            self._swarm_ops.handle_frame(link, frame)
        elif ftype == FrameType.RELAY:
            if frame.header.get("op") == "incoming":
                self._discovery.handle_relay_incoming(link, frame)
            elif self._relay is not None:
                self._relay.handle_frame(link, frame)
            else:
                link.send_error(frame, "unsupported", "this node is not a relay")
        elif ftype == FrameType.ERROR:
            self._lacks.on_error(link, frame)  # logged; unsupported_frame_type remembered, askers told
        elif ftype != FrameType.PONG:  # an unsolicited PONG is harmless
            refuse_unsupported(link, frame)
