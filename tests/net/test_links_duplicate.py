"""Two links to one peer (`node/net/_duplicates.py`): both ends keep the same one (the tie-break)
and a request on the one retired is still answered. Real PeerManagers on 127.0.0.1, real TLS;
retired links that are never drained and restarted peers: test_links_retired.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.net import Frame, FrameType, PeerManager
from tests.support.waiting import wait_until

from .util import addr, hold_work


def _one_link(a: PeerManager, b: PeerManager) -> bool:
    """Exactly one open link between a and b, and it is the same TCP connection at both ends."""
    if a.connection_count(b.node_id) != 1 or b.connection_count(a.node_id) != 1:
        return False
    la, lb = a.link(b.node_id), b.link(a.node_id)
    return la is not None and lb is not None and la.stream.extra("sockname") == lb.stream.extra("peername")


def _settled(a: PeerManager, b: PeerManager, caplog) -> int | None:
    """The number of TCP connections a and b set up with each other, once both ends have registered
    every one of them and closed all but one (nothing left in flight that could still change the
    outcome); None before that."""
    def count(line: str, peer: PeerManager) -> int:
        return caplog.text.count(f"DIAG: {line} peer_id={peer.short_id}")
    opened_a, opened_b = count("connection established", b), count("connection established", a)
    closed_a, closed_b = count("connection closed", b), count("connection closed", a)
    if opened_a == opened_b >= 1 and closed_a == closed_b == opened_a - 1 and _one_link(a, b):
        return opened_a
    return None


async def _stays_one_link(a: PeerManager, b: PeerManager) -> None:
    """The link that survived stays the only one: two more maintenance rounds at each end (where a
    redial would start) and frames (PINGs and PONGs) received on it at both ends, which a link that
    either end retired or closed would not get."""
    la, lb = a.link(b.node_id), b.link(a.node_id)
    frames_a, frames_b, rounds_a, rounds_b = la.frames_in, lb.frames_in, a.discovery.dialer.rounds, b.discovery.dialer.rounds
    await wait_until(lambda: la.frames_in >= frames_a + 2 and lb.frames_in >= frames_b + 2
                     and a.discovery.dialer.rounds >= rounds_a + 2 and b.discovery.dialer.rounds >= rounds_b + 2,
                     what="two maintenance rounds and pings on the surviving link at both ends")
    assert a.link(b.node_id) is la and b.link(a.node_id) is lb and _one_link(a, b)


@pytest.mark.parametrize("round_", range(4))
async def test_simultaneous_dial_ends_in_one_link(make_manager, fast_net, round_, caplog):
    caplog.set_level(logging.INFO)
    a = await make_manager()
    b = await make_manager()
    results = await asyncio.gather(a.async_connect(addr(b), b.node_id), b.async_connect(addr(a), a.node_id),
                                   return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)], results
    connections = await wait_until(lambda: _settled(a, b, caplog),
                                   what="one link, the same TCP connection on both ends, the other closed")
    await _stays_one_link(a, b)
    keep = a.link(b.node_id)
    dialer = a.node_id if keep.is_dialer else b.node_id
    retired = caplog.text.count("DIAG: duplicate link to one peer, retiring one")
    if connections == 2:  # both dials got through: both ends ranked them the same way
        assert retired >= 1 and dialer == min(a.node_id, b.node_id)  # the lower node id's dial survives
    else:  # one dial found the other's link already up and used it
        assert connections == 1 and retired == 0


async def test_a_duplicate_link_keeps_the_lower_node_ids_dial(make_manager, fast_net, caplog, monkeypatch):
    """The tie-break, every time: a second TCP connection is forced (node_id=None skips the
    'already linked' shortcut). The loser stays open until both ends have ranked the two links (it
    closes once each end has said it is drained); had they ranked them differently, each would
    retire the other's keeper."""
    caplog.set_level(logging.INFO)
    a = await make_manager()
    b = await make_manager()
    low, high = sorted((a, b), key=lambda m: m.node_id)
    await high.async_connect(addr(low))  # the higher id dials first ...
    await wait_until(lambda: _settled(a, b, caplog) == 1, what="the first link")
    await low.async_connect(addr(high))  # ... then the lower id dials too: a duplicate
    assert await wait_until(lambda: _settled(a, b, caplog), what="the duplicate retired") == 2
    await _stays_one_link(a, b)
    assert caplog.text.count("DIAG: duplicate link to one peer, retiring one") == 2  # both ends ranked them
    assert low.link(high.node_id).is_dialer and not high.link(low.node_id).is_dialer


@pytest.mark.parametrize("direction", ["from the dialler", "to the dialler"])
async def test_a_request_on_a_retired_duplicate_link_is_answered(make_manager, fast_net, caplog, direction):
    """A request in flight on a link that loses the duplicate tie-break gets its reply, however long
    its answer takes, and the retired link then closes at both ends. Until 2026-12-07 the end with
    nothing of its own waiting closed the link after a one-second grace (the other end after four),
    and the request failed "link ... closed (duplicate)"."""
    caplog.set_level(logging.INFO)
    a = await make_manager()
    b = await make_manager()
    low, high = sorted((a, b), key=lambda m: m.node_id)
    await high.async_connect(addr(low))  # the higher id's dial: the link that will lose
    await wait_until(lambda: _settled(a, b, caplog) == 1, what="the first link")
    asker, answerer = (high, low) if direction == "from the dialler" else (low, high)
    losing = asker.link(answerer.node_id)
    arrived, release = hold_work(answerer)
    request = asyncio.ensure_future(losing.async_request(Frame(FrameType.WORK, {}, b"held"), timeout_s=30))
    await wait_until(arrived.is_set, what="the request reached the answerer")
    await low.async_connect(addr(high))  # the lower id dials too: that link wins at both ends
    await wait_until(lambda: losing.retired and answerer.link(asker.node_id) is not None
                     and answerer.link(asker.node_id).connection_id != losing.connection_id
                     and caplog.text.count("DIAG: duplicate link to one peer, retiring one") == 2,
                     what="both ends retired the first link")
    await asyncio.sleep(1.5)  # past the old timers (one grace at the end with nothing waiting, four at the other)
    assert losing.is_open and not request.done()
    release.set()
    reply = await asyncio.wait_for(request, 10)
    assert reply.payload == b"held"
    assert await wait_until(lambda: _settled(a, b, caplog), what="the retired link closed at both ends") == 2
    assert losing.close_cause == "duplicate"
    await _stays_one_link(a, b)
