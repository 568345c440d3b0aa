"""Duplicate links to one peer: which one is kept, and what becomes of the others.

A second link to a peer comes from both ends dialling at once, from a peer dialling again (it
roamed and its old link is half-open) or from a peer that restarted. Both ends must keep the same
link, so `preferred` ranks two links on what both ends know, first rule that differs:

1. restart: the links' HELLO `boot_id`s differ. The link being registered wins (its process is the
   newer: a wall-clock ranking kept the dead process's link after a clock step, review r68), unless
   its `boot_id` is one that a restart already ended (`PeerRecord.ended_boots`, the last
   `ENDED_BOOTS_KEPT`): a late handshake of the earlier process (review r69).
2. direct beats relayed.
3. the link dialled by the lower node id.
4. between two dials by the same node, the lower dialler nonce (sent in that link's HELLO).

The loser (`retire_loser`):

- after a restart, every open link of the ended process, retired ones too, closes now ("peer
  restarted": nothing on them will be answered, their requests fail now rather than at their
  deadlines) and its `boot_id` joins `ended_boots`;
- otherwise it is retired (`PeerLink.retire`: it drains, then closes), and at most
  `DUPLICATE_LINKS_DRAINING_MAX` links per peer stay draining, the oldest closed beyond ("duplicate":
  a member dialling again and again held a socket per dial; closing every older one cut the peer's
  requests on a healthy link when both ends dialled at once, review r68).

When the kept link closes, the peer's retired links close with it (`close_retired`, review r66): a
peer that never retired its end would wait on them for `DUPLICATE_LINK_DRAIN_MAX_S`.

Pure rules over the links and the peer's record; `PeerManager._register` and `_on_link_closed` call
them (2026-12-07: moved out of `_manager.py`, no change).
"""

from __future__ import annotations

from collections.abc import Iterable

from node import const

from ._link import PeerLink
from ._table import PeerRecord


def preferred(a: PeerLink, b: PeerLink, *, me: str, ended_boots: list[str]) -> PeerLink:
    """Which of two links to one peer survives (a: the one in the table, b: the one being
    registered; me: this node's id); both ends reach the same answer."""
    if a.hello.boot_id != b.hello.boot_id:
        return a if b.hello.boot_id in ended_boots else b
    if a.transport != b.transport:
        return a if a.transport == "direct" else b
    dialer_a = me if a.is_dialer else a.node_id
    dialer_b = me if b.is_dialer else b.node_id
    if dialer_a != dialer_b:
        return a if dialer_a < dialer_b else b  # keep the link dialled by the lower node id
    return a if a.link_nonce <= b.link_nonce else b


def retired_links(links: Iterable[PeerLink], node_id: str) -> list[PeerLink]:
    """A peer's links that lost a duplicate tie-break and are still open (draining)."""
    return [old for old in links if old.node_id == node_id and old.retired and old.is_open]


def retire_loser(rec: PeerRecord, loser: PeerLink, winner: PeerLink, links: Iterable[PeerLink]) -> None:
    """Retire or close the loser of a tie-break (and, after a restart, every link of the ended
    process); `links`: all of this node's links."""
    links = list(links)
    if loser.hello.boot_id != winner.hello.boot_id:
        ended = loser.hello.boot_id
        if ended not in rec.ended_boots:
            rec.ended_boots = [*rec.ended_boots[-(const.ENDED_BOOTS_KEPT - 1):], ended]
        for old in [loser, *retired_links(links, loser.node_id)]:
            if old.hello.boot_id == ended:
                old.close("peer restarted")
        return
    loser.retire()
    draining = sorted(retired_links(links, loser.node_id), key=lambda old: old.connection_id)
    for old in draining[:max(0, len(draining) - const.DUPLICATE_LINKS_DRAINING_MAX)]:
        old.close("duplicate")


def close_retired(links: Iterable[PeerLink], node_id: str) -> None:
    """The peer's kept link closed: its retired links go too (the peer sees them go and redials)."""
    for old in retired_links(list(links), node_id):
        old.close("duplicate")
