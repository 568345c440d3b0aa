"""This node's wall clock as peers see it, and peers whose clocks disagree with ours.

Nothing a link needs depends on two clocks agreeing: TLS certificates are valid 2000-9999, the
membership proofs are HMACs over nonces and the epoch, relay tickets and liveness use each node's
monotonic clock, an invite expires on its issuer's clock alone. One thing does: the mDNS tag is
a keyed hash of the *day* (`Swarm.mdns_tag`), and a member accepts only yesterday's, today's and
tomorrow's; a member whose clock is more than a day off used to find no LAN peers at all, with only
a DEBUG line ("mdns found a node of another swarm"). Now the announcement names the day its tag is
for (TXT `d`): a tag that is the swarm's for that day, a day more than one away from ours, is a
member with a wrong clock; it is dialled anyway (admission proves membership as always) and a
WARNING names the difference once per peer. HELLO carries the sender's `time`, so peers reached by
bootstrap, PEX or a relay show a skew too (WARNING beyond `CLOCK_SKEW_WARN_S`).

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


class Clock:
    """The wall clock this node shows peers (HELLO `time`, the mDNS day)."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset_s = offset_s  # added to time.time(): tests shift one node's clock
        self._warned: set[str] = set()  # peers already warned about (once per peer per run)
        self.agreeing: set[str] = set()  # peers whose clock agreed with ours (mDNS day or HELLO time)
        self.skews_s: dict[str, float] = {}  # peer node id -> its clock minus ours (from HELLO), seconds

    def now(self) -> float:
        """Unix time on this node's clock."""
        return time.time() + self.offset_s

    def day(self) -> int:
        """The day number (UTC days since 1970) the mDNS tag is computed for."""
        return int(self.now() // const.MDNS_DAY_S)

    def accept_mdns(self, swarm: Swarm, node_id: str, tag: str, day_text: str | None) -> bool:
        """Whether an mDNS announcement with tag `tag` (for the day it names, `day_text`) is a member
        of `swarm` to dial. A member whose day is more than one from ours is dialled too, with a
        WARNING once."""
        today = self.day()
        if tag in swarm.mdns_tags_around(today):
            self.agreeing.add(node_id)
            return True
        if not day_text or len(day_text) > _MAX_DAY_DIGITS or not day_text.isdigit():
            return False  # another swarm, or a member too old to name its day
        day = int(day_text)
        if abs(day - today) <= 1 or tag != swarm.mdns_tag(day):
            return False
        self._warn(node_id, "mdns", (day - today) * const.MDNS_DAY_S, days=day - today)
        return True

    def note_hello(self, node_id: str, peer_time: float | None) -> None:
        """A peer's HELLO named its time: remember the skew, WARN once when it is large."""
        if peer_time is None:
            return
        skew = peer_time - self.now()
        self.skews_s[node_id] = skew
        if abs(skew) <= const.CLOCK_SKEW_WARN_S:
            self.agreeing.add(node_id)
            return
        self._warn(node_id, "hello", skew)

    def forget(self, node_id: str) -> None:
        """The peer's link closed: its skew is no longer current."""
        self.skews_s.pop(node_id, None)

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
