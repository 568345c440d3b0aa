"""The peer table: one record per known node, snapshots for surfaces, observer callbacks.

Records are the manager's private, mutable state; everything outside node.net reads frozen
`PeerSnapshot`s (the admin API, `swarmllm peers`, diagnostics, the GUI's table model). Observers
are plain callables run on the loop; one that raises is logged and kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._identity import short_id
from ._link import PeerLink
from ._messages import FEATURE_RELAY, Hello
from ._rto import RtoEstimator

log = logging.getLogger(__name__)

PeerState = Literal["connecting", "connected", "gone"]
PeerEventKind = Literal["added", "changed", "removed"]


@dataclass(frozen=True)
class PeerSnapshot:
    """What the node knows about one peer at one moment (JSON-ready via `as_dict`)."""

    node_id: str
    short_id: str
    state: PeerState
    transport: str | None  # "direct" | "relayed" | None (no link)
    address: str | None  # "host:port" of the live link, else the last known address
    rtt_ms: float | None
    rto_ms: float
    models: tuple[Mapping[str, Any], ...]
    last_seen: float | None  # unix time of the last frame received
    agent: str | None = None
    region: str | None = None
    hardware: Mapping[str, Any] = field(default_factory=dict)
    via_relay: str | None = None
    is_dialer: bool | None = None
    connections: int = 0
    sources: tuple[str, ...] = ()
    is_relay: bool = False
    last_error: str | None = None
    liveness_deadline_s: float | None = None  # silence after which the live link is declared dead
    connection_id: int | None = None  # this process's id of the live link (DIAG lines carry it)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        out = asdict(self)
        out["models"] = [dict(m) for m in self.models]
        out["sources"] = list(self.sources)
        out["hardware"] = dict(self.hardware)
        for key in ("rtt_ms", "rto_ms"):
            if out[key] is not None:
                out[key] = round(out[key], 3)
        return out


@dataclass
class PeerRecord:
    """Mutable per-peer state owned by the PeerManager."""

    node_id: str
    state: PeerState = "connecting"
    link: PeerLink | None = None
    hello: Hello | None = None
    addrs: list[str] = field(default_factory=list)  # direct "host:port", most recently good first
    relays: list[str] = field(default_factory=list)  # relay "host:port" it is registered at
    sources: set[str] = field(default_factory=set)  # bootstrap, mdns, pex, cache, relay, inbound
    rto: RtoEstimator = field(default_factory=RtoEstimator)
    last_seen: float | None = None
    last_address: str | None = None
    last_error: str | None = None
    gone_since: float | None = None  # monotonic
    backoff_s: float = 0.0
    next_dial_at: float = 0.0  # monotonic
    dial_failures: int = 0
    upgrade_at: float = 0.0  # monotonic: when to try a direct link next while the link is relayed
    upgrade_backoff_s: float = 0.0

    @property
    def short_id(self) -> str:
        """8-hex short id."""
        return short_id(self.node_id)

    def add_addr(self, addr: str, *, front: bool = False) -> bool:
        """Remember a direct address; True if it was new."""
        if addr in self.addrs:
            if front:
                self.addrs.remove(addr)
                self.addrs.insert(0, addr)
            return False
        if front:
            self.addrs.insert(0, addr)
        else:
            self.addrs.append(addr)
        del self.addrs[16:]
        return True

    def add_relay(self, relay: str) -> bool:
        """Remember a relay the peer is registered at; True if it was new."""
        if relay in self.relays:
            return False
        self.relays.append(relay)
        del self.relays[8:]
        return True

    def snapshot(self, connections: int) -> PeerSnapshot:
        """Frozen view of this record."""
        link, hello = self.link, self.hello
        last_seen = self.last_seen
        if link is not None:
            last_seen = time.time() - (time.monotonic() - link.last_seen)
        return PeerSnapshot(
            node_id=self.node_id,
            short_id=self.short_id,
            state=self.state,
            transport=link.transport if link else None,
            address=link.address if link else self.last_address or (self.addrs[0] if self.addrs else None),
            rtt_ms=(link.rtt_s * 1000) if link and link.rtt_s is not None else (
                self.rto.last_rtt_s * 1000 if self.rto.last_rtt_s is not None else None),
            rto_ms=self.rto.rto_s * 1000,
            models=tuple(hello.models) if hello else (),
            last_seen=last_seen,
            agent=hello.agent if hello else None,
            region=hello.region if hello else None,
            hardware=hello.hardware if hello else {},
            via_relay=link.via_relay if link else None,
            is_dialer=link.is_dialer if link else None,
            connections=connections,
            sources=tuple(sorted(self.sources)),
            is_relay=bool(hello and hello.features & FEATURE_RELAY),
            last_error=self.last_error,
            liveness_deadline_s=link.liveness_deadline_s() if link else None,
            connection_id=link.connection_id if link else None,
        )


PeerObserver = Callable[[PeerEventKind, PeerSnapshot], None]
