"""Peer network: identity, TLS 1.3 links, framed protocol, discovery (mDNS, bootstrap, PEX,
relay rendezvous, peer cache), relay, and the peer table.

Everything else in the node uses only these names; the modules behind them are private.
"""

from ._frames import FLAG_RESPONSE, Frame, FrameType, type_name
from ._identity import Identity, async_load_or_create_identity, load_or_create_identity, short_id
from ._link import PeerLink
from ._manager import PeerManager
from ._membership import Swarm, write_swarm_file
from ._messages import PROTOCOL_VERSION, ErrorInfo, Hello
from ._rto import RtoEstimator
from ._table import PeerSnapshot

__all__ = [
    "FLAG_RESPONSE",
    "PROTOCOL_VERSION",
    "ErrorInfo",
    "Frame",
    "FrameType",
    "Hello",
    "Identity",
    "PeerLink",
    "PeerManager",
    "PeerSnapshot",
    "RtoEstimator",
    "Swarm",
    "async_load_or_create_identity",
    "load_or_create_identity",
    "short_id",
    "type_name",
    "write_swarm_file",
]
