"""The never-linked PEX pool (PEX_MAX_UNLINKED) shared by every member: a real PeerTable and Pex,
frames from links under several node ids.

Found in review (2026-12-07): a per-member cap of 32, below one honest PEX frame (PEX_MAX_PEERS,
64), had a fresh node learn only 32 of its bootstrap's 64 peers, with a WARNING at every start;
and the cap was per node id, which a member makes as many of as it likes: a member linked under 4
ids filled the pool again and an honest member's peers were not learnt. Now a full pool makes
room by forgetting what the member holding the largest share taught.

Found in review (2026-12-07, later): that allowance (PEX_EVICT_PER_PEER per interval) was per node
id too, so 50 made-up ids had 3,200 records learnt, forgotten and dialled in one interval, and an
evicted record's dial ran on: the dials in flight were no longer bounded by the pool. Now a record
being dialled is not pushed out: the pool bounds the dials in flight, and each record's dial ends
before its place is taken."""

from __future__ import annotations

import logging
import secrets

from node import const
from node.net._foreign import ForeignPeers
from node.net._link import PeerLink
from node.net._messages import Hello, PexEntry, pex_frame
from node.net._pex import Pex
from node.net._rto import RtoEstimator
from node.net._table import PeerTable
from node.net._tasks import Tasks

NOT_LEARNT = "DIAG: peers from PEX not learnt"


class _Stream:
    def writelines(self, parts) -> None:
        pass


class _Node:
    """A real PeerTable and Pex; members are linked records with a live link each."""

    def __init__(self, hold_dials: bool = False) -> None:
        self.table = PeerTable(lambda _node_id: 0)
        self.dialled: list[str] = []
        self.hold_dials = hold_dials  # a dial runs until the test ends it (else it ends at once)
        self.in_flight: set[str] = set()  # dials started and not ended (a socket each)
        self.pex = Pex("a" * 64, self.table, Tasks(), ForeignPeers(lambda: None), set(), self._dial)
        self.pex.dialing = lambda node_id: node_id in self.in_flight  # as Discovery sets the dialer's

    def _dial(self, rec) -> None:
        self.dialled.append(rec.node_id)
        if self.hold_dials:
            self.in_flight.add(rec.node_id)

    def member(self) -> PeerLink:
        node_id = secrets.token_hex(32)
        hello = Hello(node_id=node_id, boot_id="x", agent="t", listen_port=4000)
        link = PeerLink(_Stream(), node_id=node_id, hello=hello, link_nonce="n", transport="direct",
                        is_dialer=False, address="192.0.2.7:4000", rto=RtoEstimator(), dispatch=lambda *_: None)
        rec = self.table.record(node_id, "inbound")
        rec.hello, rec.link, rec.state = hello, link, "connected"
        return link

    def send(self, link: PeerLink, count: int) -> list[str]:
        ids = [secrets.token_hex(32) for _ in range(count)]
        self.pex.handle(link, pex_frame([PexEntry(i, (f"198.51.100.{n % 250 + 1}:9",), ()) for n, i in enumerate(ids)]))
        return ids

    def known(self, ids: list[str]) -> int:
        return sum(1 for i in ids if self.table.get(i) is not None)


async def test_a_full_frame_from_a_bootstrap_is_learnt_whole_without_a_warning(caplog):
    node = _Node()
    caplog.set_level(logging.WARNING, "node.net._pex")
    ids = node.send(node.member(), const.PEX_MAX_PEERS)
    assert node.known(ids) == const.PEX_MAX_PEERS
    assert sorted(node.dialled) == sorted(ids)
    assert NOT_LEARNT not in caplog.text


async def test_a_member_under_several_ids_cannot_keep_an_honest_members_peers_out(caplog):
    node = _Node()
    hostile = [node.member() for _ in range(4)]
    made_up = [i for link in hostile for i in node.send(link, const.PEX_MAX_UNLINKED)]
    assert node.known(made_up) == const.PEX_MAX_UNLINKED  # the pool is full of made-up peers
    caplog.set_level(logging.WARNING, "node.net._pex")
    caplog.clear()
    real = node.send(node.member(), const.PEX_MAX_PEERS)
    assert node.known(real) == const.PEX_MAX_PEERS
    assert node.known(made_up) == const.PEX_MAX_UNLINKED - const.PEX_MAX_PEERS
    assert node.table.never_linked("pex") == const.PEX_MAX_UNLINKED
    assert NOT_LEARNT not in caplog.text


async def test_a_member_cannot_push_out_its_own_or_more_than_a_frame_per_interval():
    """What bounds the churn (each record an observer event and a dial): a member never makes room
    by forgetting its own, and pushes out at most PEX_EVICT_PER_PEER per PEX_INTERVAL_S."""
    node = _Node()
    first, second = node.member(), node.member()
    old = node.send(first, const.PEX_MAX_UNLINKED)
    again = node.send(first, 200)
    assert node.known(old) == const.PEX_MAX_UNLINKED and node.known(again) == 0
    newer = node.send(second, 200) + node.send(second, 200)
    assert node.known(newer) == const.PEX_EVICT_PER_PEER
    assert node.table.never_linked("pex") == const.PEX_MAX_UNLINKED


async def test_many_sender_ids_cannot_churn_the_pool_nor_pile_up_dials():
    """Two honest members fill the pool, their peers being dialled; then 50 more ids send a full
    frame each: a record being dialled is not forgotten (its dial would run on, a socket more past
    the pool's bound): nothing is pushed out, nothing more dialled. Once those dials ended, 50 more
    ids take the pool's places once, and no more while those dials run."""
    node = _Node(hold_dials=True)
    honest = [i for link in (node.member(), node.member()) for i in node.send(link, const.PEX_MAX_PEERS)]
    assert node.known(honest) == const.PEX_MAX_UNLINKED and len(node.in_flight) == const.PEX_MAX_UNLINKED
    for _ in range(50):
        node.send(node.member(), const.PEX_MAX_PEERS)
    assert node.known(honest) == const.PEX_MAX_UNLINKED  # their dials run on, their records kept
    assert len(node.dialled) == const.PEX_MAX_UNLINKED
    node.in_flight.clear()  # those dials failed (the made-up addresses answer nothing)
    for _ in range(50):
        node.send(node.member(), const.PEX_MAX_PEERS)
    assert len(node.dialled) == 2 * const.PEX_MAX_UNLINKED
    assert len(node.in_flight) <= const.PEX_MAX_UNLINKED
    assert node.table.never_linked("pex") == const.PEX_MAX_UNLINKED
