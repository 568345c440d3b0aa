"""This node's wall clock as peers see it, and peers whose clocks disagree with ours.

Nothing a link needs depends on two clocks agreeing: TLS certificates are valid 2000-9999, the
membership proofs are HMACs over nonces and the epoch, relay tickets and liveness use each node's
monotonic clock, an invite expires on its issuer's clock alone. One thing does: the mDNS tag is
a keyed hash of the *day* (`Swarm.mdns_tag`), and a member accepts only yesterday's, today's and
tomorrow's; a member whose clock is more than a day off used to find no LAN peers at all, with only
a DEBUG line ("mdns found a node of another swarm"). Now the announcement names the day its tag is
for (TXT `d`): a tag that is the swarm's for that day, a day more than one (and at most
`MDNS_CLOCK_SKEW_MAX_DAYS`) away from ours, is a member with a wrong clock or a replayed
announcement; it is dialled anyway (admission proves membership as always). Nothing is warned
about and nothing counted from mDNS itself: the claimed difference is remembered (a bounded map)
and the WARNING comes from `note_hello`, once the peer's HELLO has proved it a member. HELLO
carries the sender's `time`, so peers reached by bootstrap, PEX or a relay show a skew too (WARNING
beyond `CLOCK_SKEW_WARN_S`). Until 2026-12-06 any day was accepted and warned about at once, so a
recorded announcement replayed under made-up node ids logged a WARNING each, grew the sets below
without bound and, after two, told the user `likely_wrong=this_machine`.

`Clock.offset_s` shifts this node's clock (tests; one object per node, never a global).
"""

from __future__ import annotations

import logging
import time

from node import const
from node.logs import kv

from ._identity import short_id
from ._membership import Swarm

log = logging.getLogger(__name__)

_MAX_DAY_DIGITS = 9  # a TXT `d` longer than this is not a day (year 2.7 million)
_MDNS_CLAIMS_MAX = 256  # mDNS day claims remembered until a HELLO (the oldest is dropped past it)


class Clock:
    """The wall clock this node shows peers (HELLO `time`, the mDNS day)."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset_s = offset_s  # added to time.time(): tests shift one node's clock
        # both filled from admitted links only (note_hello), never from an mDNS announcement
        self._warned: set[str] = set()  # peers already warned about (once per peer per run)
        self.agreeing: set[str] = set()  # peers whose HELLO time agreed with ours
        self._mdns_days: dict[str, int] = {}  # node id -> its mDNS day minus ours, until its HELLO
        self.skews_s: dict[str, float] = {}  # peer node id -> its clock minus ours (from HELLO), seconds

    def now(self) -> float:
        """Unix time on this node's clock."""
        return time.time() + self.offset_s

    def day(self) -> int:
        """The day number (UTC days since 1970) the mDNS tag is computed for."""
        return int(self.now() // const.MDNS_DAY_S)

    def accept_mdns(self, swarm: Swarm, node_id: str, tag: str, day_text: str | None) -> bool:
        """Whether an mDNS announcement with tag `tag` (for the day it names, `day_text`) is a member
        of `swarm` to dial. A member whose day is more than one (at most MDNS_CLOCK_SKEW_MAX_DAYS)
        from ours is dialled too; the difference is warned about once its HELLO is admitted."""
        today = self.day()
        if tag in swarm.mdns_tags_around(today):
            return True
        if not day_text or len(day_text) > _MAX_DAY_DIGITS or not day_text.isdigit():
            return False  # another swarm, or a member too old to name its day
        days = int(day_text) - today
        if abs(days) <= 1 or abs(days) > const.MDNS_CLOCK_SKEW_MAX_DAYS or tag != swarm.mdns_tag(today + days):
            return False
        log.debug("DIAG: mdns found a member whose day is not ours %s", kv(peer_id=short_id(node_id), skew_days=days))
        self._mdns_days.pop(node_id, None)
        if len(self._mdns_days) >= _MDNS_CLAIMS_MAX:
            del self._mdns_days[next(iter(self._mdns_days))]
        self._mdns_days[node_id] = days
        return True

    def note_hello(self, node_id: str, peer_time: float | None) -> None:
        """An admitted peer's HELLO: remember its skew (from its `time`), WARN once when it is
        large (or, with no `time`, when its mDNS announcement named a day far from ours)."""
        days = self._mdns_days.pop(node_id, None)
        if peer_time is None:
            if days is not None:
                self._warn(node_id, "mdns", days * const.MDNS_DAY_S, days=days)
            return
        skew = peer_time - self.now()
        self.skews_s[node_id] = skew
        if abs(skew) <= const.CLOCK_SKEW_WARN_S:
            self.agreeing.add(node_id)
            return
        self._warn(node_id, "hello", skew, days=days)

    def forget(self, node_id: str) -> None:
        """The peer's link closed: its skew is no longer current."""
        self.skews_s.pop(node_id, None)

    def drop(self, node_id: str) -> None:
        """The peer table forgot the peer: nothing of it is kept (a node meets peers for weeks)."""
        self.forget(node_id)
        self.agreeing.discard(node_id)
        self._warned.discard(node_id)
        self._mdns_days.pop(node_id, None)

    def _warn(self, node_id: str, site: str, skew_s: float, days: int | None = None) -> None:
        if node_id in self._warned:
            return
        self._warned.add(node_id)
        agreeing = len(self.agreeing - {node_id})
        if agreeing:  # other peers' clocks agree with ours
            likely = "peer"
        elif len(self._warned) > 1:  # several peers disagree with us, none agrees
            likely = "this_machine"
        else:
            likely = "unknown"
        log.warning("DIAG: a peer's clock is far from ours, check the date and time %s", kv(
            peer_id=short_id(node_id), site=site, skew_s=round(skew_s), skew_days=days,
            likely_wrong=likely, agreeing_peers=agreeing))
