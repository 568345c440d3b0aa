"""The peer table: one record per known node, snapshots for surfaces, observer callbacks.

`PeerTable` is the one owner of the records: the manager and the discovery parts create, look up,
announce and forget them only through it. Records are private and mutable; everything outside
node.net reads frozen `PeerSnapshot`s (the admin API, `swarmllm peers`, diagnostics, the GUI's
table model). Observers are plain callables run on the loop; one that raises is logged and kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from node import const
from node.const import REGION_MAX_CHARS
from node.logs import region_code
from node.observe import Observers

from ._identity import short_id
from ._link import PeerLink
from ._messages import FEATURE_RELAY, Hello
from ._rto import RtoEstimator

log = logging.getLogger(__name__)

PeerState = Literal["connecting", "connected", "gone", "refused"]  # refused: not in this swarm
PeerEventKind = Literal["added", "changed", "removed"]


@dataclass(frozen=True)
class PeerSnapshot:
    """What the node knows about one peer at one moment (JSON-ready via `as_dict`)."""

    node_id: str
    short_id: str
    state: PeerState
    transport: str | None  # "direct" | "relayed" | None (no link)
    address: str | None  # "host:port" to dial the peer at (its live link's), else the last known address
    rtt_ms: float | None
    rto_ms: float
    models: tuple[Mapping[str, Any], ...]
    last_seen: float | None  # unix time of the last frame received
    agent: str | None = None
    region: str | None = None
    hardware: Mapping[str, Any] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # sha256 of the whole files it hands out layers of (its HELLO's `files`)
    via_relay: str | None = None
    is_dialer: bool | None = None
    connections: int = 0
    sources: tuple[str, ...] = ()
    is_relay: bool = False
    last_error: str | None = None
    liveness_deadline_s: float | None = None  # silence after which the live link is declared dead
    connection_id: int | None = None  # this process's id of the live link (DIAG lines carry it)
    boot_id: str | None = None  # its last HELLO's: a new one is a restarted process (not a relinked one)
    # the sampling features its HELLO lists (None: it lists none, a version before 2026-12-07)
    sampling: frozenset[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        out = asdict(self)
        out["models"] = [dict(m) for m in self.models]
        out["sources"] = list(self.sources)
        out["hardware"] = dict(self.hardware)
        out["files"] = list(self.files)
        out["sampling"] = None if self.sampling is None else sorted(self.sampling)
        for key in ("rtt_ms", "rto_ms"):
            if out[key] is not None:
                out[key] = round(out[key], 3)
        return out


@dataclass
class PeerRecord:
    """Mutable per-peer state, owned by the PeerTable."""

    node_id: str
    state: PeerState = "connecting"
    link: PeerLink | None = None
    hello: Hello | None = None
    addrs: list[str] = field(default_factory=list)  # direct "host:port", most recently good first
    # addr -> [unix time of its first failed dial since it last worked, failed dials since]
    addr_failing: dict[str, list[float]] = field(default_factory=dict)
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
    was_relay: bool = False  # peers.json says its last HELLO announced FEATURE_RELAY
    # boot_ids of its processes whose links lost to a newer one (a restart): a late handshake of one
    # of them must not win over the newer process's link (review r69); the last few only
    ended_boots: list[str] = field(default_factory=list)
    taught_by: str | None = None  # the member whose PEX first named it (its share of PEX_MAX_UNLINKED)
    # as a PEX sender: what it may still push out of a full pool [records, monotonic time of the last]
    pex_evictions: list[float] = field(default_factory=lambda: [float(const.PEX_EVICT_PER_PEER), 0.0])

    @property
    def is_relay(self) -> bool:
        """Its HELLO announced a relay service, or peers.json remembers that it did."""
        return bool(self.hello.features & FEATURE_RELAY) if self.hello is not None else self.was_relay

    @property
    def short_id(self) -> str:
        """8-hex short id."""
        return short_id(self.node_id)

    def add_addr(self, addr: str, *, front: bool = False) -> bool:
        """Remember a direct address (front: it just worked); True if it was new."""
        if front:
            self.addr_failing.pop(addr, None)
        if addr in self.addrs:
            if front:
                self.addrs.remove(addr)
                self.addrs.insert(0, addr)
            return False
        if front:
            self.addrs.insert(0, addr)
        else:  # a full list makes room: the new address (a peer that moved) must not be the one dropped
            del self.addrs[const.PEER_MAX_ADDRS - 1:]
            self.addrs.append(addr)
        del self.addrs[const.PEER_MAX_ADDRS:]
        for gone in self.addr_failing.keys() - set(self.addrs):
            del self.addr_failing[gone]
        return True

    def addr_failed(self, addr: str, now: float) -> bool:
        """A dial to addr failed; True if that dropped it: it has failed for PEER_ADDR_STALE_S, at
        least PEER_ADDR_STALE_FAILURES times, and not worked since (an old DHCP lease, a Wi-Fi left
        behind; until 2026-12-06 every address a peer ever had was kept and dialled, in memory and
        in peers.json). The most recently good address (the first) is kept: a peer that is only away
        comes back there."""
        if addr not in self.addrs:
            return False
        entry = self.addr_failing.setdefault(addr, [now, 0])
        entry[1] += 1
        if (entry[1] < const.PEER_ADDR_STALE_FAILURES or now - entry[0] < const.PEER_ADDR_STALE_S
                or addr == self.addrs[0]):
            return False
        self.addrs.remove(addr)
        del self.addr_failing[addr]
        return True

    def addr_stale(self, addr: str, now: float) -> bool:
        """Whether addr counts as stale here: its dials have failed for PEER_ADDR_STALE_S, at least
        PEER_ADDR_STALE_FAILURES times, and it has not worked since (what drops an address that is
        not the first; one failure is not that: this node's own NAT or egress may be the cause)."""
        entry = self.addr_failing.get(addr)
        return (entry is not None and entry[1] >= const.PEER_ADDR_STALE_FAILURES
                and now - entry[0] >= const.PEER_ADDR_STALE_S)

    def remove_addr(self, addr: str) -> None:
        """Forget a direct address (someone else lives there now)."""
        if addr in self.addrs:
            self.addrs.remove(addr)
        self.addr_failing.pop(addr, None)

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
            # where the peer can be dialled: a peer that dialled us showed the port its connection
            # came from (an ephemeral one, useless to bootstrap from), not the one it listens on
            address=link.dial_address if link else self.last_address or (self.addrs[0] if self.addrs else None),
            rtt_ms=(link.rtt_s * 1000) if link and link.rtt_s is not None else (
                self.rto.last_rtt_s * 1000 if self.rto.last_rtt_s is not None else None),
            rto_ms=self.rto.rto_s * 1000,
            models=tuple(hello.models) if hello else (),
            last_seen=last_seen,
            agent=hello.agent if hello else None,
            # the peer's word, shown in reports, logs and tables: one word (a newline forged report lines;
            # `US,EU,TH outcome=ok` three regions and a field of a summary line's `regions=`)
            region=region_code(hello.region, REGION_MAX_CHARS) if hello else None,
            hardware=hello.hardware if hello else {},
            files=hello.files if hello else (),
            sampling=hello.sampling if hello else None,
            via_relay=link.via_relay if link else None,
            is_dialer=link.is_dialer if link else None,
            connections=connections,
            sources=tuple(sorted(self.sources)),
            is_relay=self.is_relay,
            last_error=self.last_error,
            liveness_deadline_s=link.liveness_deadline_s() if link else None,
            connection_id=link.connection_id if link else None,
            boot_id=(hello.boot_id or None) if hello else None,
        )


PeerObserver = Callable[[PeerEventKind, PeerSnapshot], None]

_STATE_ORDER = {"connected": 0, "connecting": 1, "gone": 2}


class PeerTable:
    """The records of every known peer and the observers told when one is added, changes or goes.

    `connection_count(node_id)` counts the open links to a peer (retiring duplicates included);
    the manager owns the links, the table only shows the count in snapshots."""

    def __init__(self, connection_count: Callable[[str], int]) -> None:
        self._records: dict[str, PeerRecord] = {}
        self._connection_count = connection_count
        self.observers: Observers[[str, PeerSnapshot]] = Observers("peer")

    def __iter__(self) -> Iterator[PeerRecord]:
        """The records, in the order they were learnt (a copy: the table may change meanwhile)."""
        return iter(list(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def get(self, node_id: str) -> PeerRecord | None:
        """The record of a peer, None if unknown."""
        return self._records.get(node_id)

    def record(self, node_id: str, source: str | None = None) -> PeerRecord:
        """The record of a peer, created (and announced as added) if it is new; `source` (bootstrap,
        mdns, pex, cache, relay, inbound, ...) joins its sources."""
        rec = self._records.get(node_id)
        if rec is None:
            rec = self._records[node_id] = PeerRecord(node_id)
            if source:
                rec.sources.add(source)
            self.observers.emit("added", self.snapshot(rec))
        elif source:
            rec.sources.add(source)
        return rec

    def link(self, node_id: str) -> PeerLink | None:
        """The live link to a peer (never a retired duplicate), or None."""
        rec = self._records.get(node_id)
        link = rec.link if rec else None
        return link if link is not None and link.is_open and not link.retired else None

    def live_links(self) -> list[PeerLink]:
        """The live link of every peer that has one."""
        return [link for node_id in list(self._records) if (link := self.link(node_id)) is not None]

    def never_linked(self, source: str) -> int:
        """Peers learnt from `source` ("pex", "relay" or "mdns": a peer's or a LAN stranger's word,
        perhaps made up) that never linked and were learnt from nowhere else but those (one learnt
        from two counts for both)."""
        return len(self.never_linked_records(source))

    def never_linked_records(self, source: str) -> list[PeerRecord]:
        """The records `never_linked` counts, oldest first."""
        return [rec for rec in self._records.values()
                if rec.hello is None and source in rec.sources and rec.sources <= {"pex", "relay", "mdns"}]

    def linked_count(self) -> int:
        """How many peers have a link recorded (open, or closing right now)."""
        return sum(1 for rec in self._records.values() if rec.link is not None)

    def snapshot(self, rec: PeerRecord) -> PeerSnapshot:
        """Frozen view of one record."""
        return rec.snapshot(self._connection_count(rec.node_id))

    def snapshots(self) -> list[PeerSnapshot]:
        """Every peer, connected first, then connecting, then gone; by short id within each."""
        snaps = [self.snapshot(rec) for rec in self._records.values()]
        return sorted(snaps, key=lambda s: (_STATE_ORDER.get(s.state, 3), s.short_id))

    def emit_changed(self, rec: PeerRecord) -> None:
        """Tell observers a record changed (not one forgotten meanwhile: a dial of an evicted record ends)."""
        if self._records.get(rec.node_id) is not rec:
            return
        self.observers.emit("changed", self.snapshot(rec))

    def forget(self, rec: PeerRecord) -> None:
        """Remove a record (long gone, nothing to dial, or not a SwarmLLM peer after all)."""
        if self._records.pop(rec.node_id, None) is not None:
            self.observers.emit("removed", self.snapshot(rec))
