"""Peer exchange (PEX): tell each peer who else we are linked to, and learn its peers.

Sent when a link comes up and every `PEX_INTERVAL_S` on every live link: the connected peers
(not the receiver itself) with their dialable direct addresses and the relays they are registered
at, at most `PEX_MAX_PEERS`. Loopback addresses go only to loopback peers; an address that counts as
stale here (`PeerRecord.addr_stale`: failing for a day, three dials) is not passed on (until
2026-12-06 it was: a member that had dropped a peer's old lease learnt it again from a peer that still
held it, and dialled it again; then, briefly, one failed dial from this node withheld it for good,
though this node's own NAT or egress may be what fails and others reach it). A received entry adds
addresses and relays to that peer's record and has it dialled at once if it has no link.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from node import const
from node.errors import PeerError
from node.logs import kv

from ._addr import dialable, is_loopback, parse_addr
from ._foreign import ForeignPeers
from ._frames import Frame
from ._link import PeerLink
from ._messages import PexEntry, parse_pex, pex_frame
from ._table import PeerRecord, PeerTable
from ._tasks import Tasks

log = logging.getLogger(__name__)


class Pex:
    """Sends and learns from PEX frames."""

    def __init__(self, node_id: str, table: PeerTable, tasks: Tasks, foreign: ForeignPeers,
                 self_addrs: set[str], dial_soon: Callable[[PeerRecord], None]):
        self._node_id = node_id
        self._table = table
        self._tasks = tasks
        self._foreign = foreign
        self._self_addrs = self_addrs
        self._dial_soon = dial_soon
        # whether a dial of that node id is under way: the dialer's (set by Discovery)
        self.dialing: Callable[[str], bool] = lambda _node_id: False
        self._own: frozenset[str] = frozenset()
        self._capped = False  # the last PEX frame met PEX_MAX_UNLINKED (logged once per episode)

    def start(self, listen_addrs: Iterable[str]) -> None:
        """Know our own addresses (never learnt from others) and start the periodic exchange."""
        self._own = frozenset(listen_addrs)
        self._tasks.spawn(self._async_loop(), name="peer-pex")

    def set_own(self, listen_addrs: Iterable[str]) -> None:
        """Our addresses changed (another network): the new ones are ours, never learnt from others."""
        self._own = frozenset(listen_addrs)

    def send(self, link: PeerLink) -> None:
        """Send our peers to one link now."""
        try:
            link.send_nowait(pex_frame(self._entries(link)))
        except PeerError:
            pass

    def handle(self, link: PeerLink, frame: Frame) -> None:
        """Learn peers from a PEX frame (a malformed one closes the link). Peers known only from
        PEX and never linked are at most PEX_MAX_UNLINKED: node ids cost nothing to make up, and 20
        frames of 256 made-up peers from one member had this node dial 5,120 addresses at once
        (a file descriptor each) and stall its loop for minutes (every record an observer event).
        When the pool is full, a member's new peer takes the place of one that the member holding the
        largest share of the pool taught (its failed ones first, then the oldest): made-up ids, under
        as many member ids as one likes, hold space only until an honest member's next PEX. A member
        pushes out at most PEX_EVICT_PER_PEER per PEX_INTERVAL_S (a full frame), never its own, and
        never a peer being dialled: the pool bounds the dials in flight, and a record must have had
        its dial end before it makes room (2026-12-07 review: the allowance is per node id, which
        costs nothing, and an evicted record's dial ran on: 50 ids had 3,200 records learnt,
        forgotten and dialled in one interval, the dials in flight no longer bounded by the pool)."""
        pool = _Pool(self._table.never_linked_records("pex"), link.node_id)
        sender = self._table.get(link.node_id)
        allowance = _Allowance(sender.pex_evictions if sender is not None else None, const.PEX_EVICT_PER_PEER)
        skipped = evicted = 0
        from_loopback = _loopback_link(link)
        for entry in parse_pex(frame):
            if entry.node_id == self._node_id or self._foreign.skip(entry.node_id, "pex"):
                continue
            addrs = [a for a in entry.addrs if a not in self._own and a not in self._self_addrs
                     and dialable(a, from_loopback)]
            if not addrs and not entry.relays:  # nothing to dial: no record (it would sit "connecting")
                continue
            fresh = self._table.get(entry.node_id) is None
            if fresh and pool.size >= const.PEX_MAX_UNLINKED:
                victim = pool.victim(self.dialing) if allowance.left() else None
                if victim is None:
                    skipped += 1
                    continue
                allowance.spend()
                self._table.forget(victim)
                evicted += 1
            rec = self._table.record(entry.node_id, "pex")
            if fresh:
                rec.taught_by = link.node_id
                pool.add(rec)
            new = False
            for addr in addrs:
                new |= rec.add_addr(addr)
            for relay in entry.relays:
                new |= rec.add_relay(relay)
            if new:
                self._dial_soon(rec)
        allowance.save()
        if evicted:
            log.debug("DIAG: never-linked peers from PEX forgotten to make room %s", kv(
                peer_id=link.short_id, evicted=evicted, unlinked=pool.size))
        if skipped and not self._capped:
            log.warning("DIAG: peers from PEX not learnt, too many unlinked ones %s", kv(
                peer_id=link.short_id, skipped=skipped, unlinked=pool.size, max_unlinked=const.PEX_MAX_UNLINKED,
                from_this_peer=pool.own, evicted=evicted, max_evict_per_peer=const.PEX_EVICT_PER_PEER))
        self._capped = bool(skipped)

    def _entries(self, to: PeerLink) -> list[PexEntry]:
        keep_loopback = is_loopback(parse_addr(to.address)[0]) if to.transport == "direct" else False
        entries = []
        now = time.time()
        for rec in self._table:
            if rec.link is None or rec.node_id == to.node_id:
                continue
            addrs = [a for a in rec.addrs[:8] if (keep_loopback or not is_loopback(parse_addr(a)[0]))
                     and not rec.addr_stale(a, now)]  # stale here: another member would re-teach it
            if addrs or rec.relays:  # a peer that cannot be dialled (it listens nowhere) is not introduced
                entries.append(PexEntry(rec.node_id, tuple(addrs), tuple(rec.relays[:4])))
        return entries[: const.PEX_MAX_PEERS]

    async def _async_loop(self) -> None:
        while not self._tasks.stopping:
            await asyncio.sleep(const.PEX_INTERVAL_S)
            for link in self._table.live_links():
                self.send(link)


class _Pool:
    """The never-linked PEX records by the member that taught them, each member's in the order
    they go first when the pool makes room: those whose dials failed, then the oldest."""

    def __init__(self, records: list[PeerRecord], sender: str):
        self._sender = sender
        self._by_member: dict[str | None, list[PeerRecord]] = {}
        for rec in sorted(records, key=lambda r: r.state != "gone"):  # stable: oldest first within
            self._by_member.setdefault(rec.taught_by, []).append(rec)
        self.size = len(records)

    @property
    def own(self) -> int:
        return len(self._by_member.get(self._sender, ()))

    def add(self, rec: PeerRecord) -> None:
        self._by_member.setdefault(rec.taught_by, []).append(rec)
        self.size += 1

    def victim(self, dialing: Callable[[str], bool]) -> PeerRecord | None:
        """Taken out of the pool: the first record not being dialled of the member (not the sender)
        with the most (a dial under way is left to end: a socket each, the pool bounds them)."""
        others = sorted((m for m, recs in self._by_member.items() if m != self._sender and recs),
                        key=lambda m: len(self._by_member[m]), reverse=True)
        for member in others:
            recs = self._by_member[member]
            for i, rec in enumerate(recs):
                if not dialing(rec.node_id):
                    self.size -= 1
                    return recs.pop(i)
        return None


class _Allowance:
    """What may still be pushed out of a full pool (`per_interval`, refilled over PEX_INTERVAL_S):
    by one member (kept on its record) or by all of them (kept by Pex); `state` is [tokens, at]."""

    def __init__(self, state: list[float] | None, per_interval: int):
        now = time.monotonic()
        self._state = state
        tokens, at = state if state is not None else (0.0, now)
        self._tokens = min(float(per_interval), tokens + (now - at) * per_interval / const.PEX_INTERVAL_S)
        self._now = now

    def left(self) -> bool:
        return self._tokens >= 1.0

    def spend(self) -> None:
        self._tokens -= 1.0

    def save(self) -> None:
        if self._state is not None:
            self._state[:] = [self._tokens, self._now]


def _loopback_link(link: PeerLink | None) -> bool:
    """Whether the link comes from this machine (its peers' loopback addresses are ours too)."""
    try:
        return link is not None and link.transport == "direct" and is_loopback(parse_addr(link.address)[0])
    except ValueError:
        return False
