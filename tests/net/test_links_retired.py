"""Retired duplicate links (review r66 of the drain handshake, 2026-12-07): a retired link waits for
its peer to say it is drained, so whatever that peer never says must not keep it — or keep this
node without a usable link. Real PeerManagers on 127.0.0.1, real TLS."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from node import const
from node.errors import PeerUnreachable
from node.net import Frame, FrameType
from node.net._link import PeerLink
from tests.support.waiting import wait_until

from .util import addr, hold_work, linked_pair


def _silent_about_draining(monkeypatch, manager) -> None:
    """`manager`'s links never say they are drained (an older version, a peer that never retired)."""
    real = PeerLink._maybe_drained
    monkeypatch.setattr(PeerLink, "_maybe_drained", lambda self: None if self in manager.links else real(self))


async def test_a_peer_whose_only_link_was_retired_links_again_when_the_kept_one_dies(
        make_manager, fast_net, monkeypatch, caplog):
    """A laptop roams: its old link to a desktop is half-open, it dials in again, and at the desktop
    the old link wins the tie-break, so the laptop's only live link is retired there. The old one then
    dies of missed pings. The desktop (which cannot dial a laptop behind NAT) had no link to it for
    DUPLICATE_LINK_DRAIN_MAX_S while the laptop believed itself linked; now the retired link goes with
    the kept one and the laptop redials at once."""
    caplog.set_level(logging.INFO)
    desktop = await make_manager()
    laptop = await make_manager()
    await laptop.async_connect(addr(desktop))
    await wait_until(lambda: desktop.link(laptop.node_id) is not None and laptop.link(desktop.node_id) is not None)
    laptop._server.close()  # noqa: SLF001 (behind NAT: the desktop cannot dial it)
    old_here, old_there = desktop.link(laptop.node_id), laptop.link(desktop.node_id)
    old_here.link_nonce = ""  # the old link ranks first at the desktop (a nonce draw: half the time)
    old_there.stream.transport.pause_reading()  # half-open: the laptop's end reads and sends nothing more
    monkeypatch.setattr(old_there.stream, "close", lambda: None)  # and no FIN reaches the desktop
    monkeypatch.setattr(old_there.stream, "abort", lambda: None)
    old_there.close("network changed")  # the laptop's dialer dials the desktop again
    await wait_until(lambda: old_here.close_cause is not None, 15, what="the old link dead at the desktop")
    gone_at = time.monotonic()
    relinked = await wait_until(lambda: desktop.link(laptop.node_id), 15, what="the desktop linked to the laptop again")
    assert relinked is not old_here and not relinked.retired and time.monotonic() - gone_at < 15


async def test_a_peer_dialling_again_and_again_leaves_a_few_draining_links_at_most(make_manager, fast_net, monkeypatch):
    """Each dial of a peer that never says it is drained retired the last one, and every loser stayed
    open for DUPLICATE_LINK_DRAIN_MAX_S: 300 dials in a second held 300 sockets (file descriptors:
    256 by default on macOS). At most DUPLICATE_LINKS_DRAINING_MAX now, the oldest closed first."""
    a = await make_manager()
    b = await make_manager()
    _silent_about_draining(monkeypatch, b)
    await b.async_connect(addr(a))
    await wait_until(lambda: a.link(b.node_id) is not None)
    for _ in range(20):
        await b.async_connect(addr(a))  # (no node id: a new TCP and TLS link each time)
    retired = [link for link in a.links if link.node_id == b.node_id and link.is_open and link.retired]
    assert len(retired) <= const.DUPLICATE_LINKS_DRAINING_MAX, f"{len(retired)} retired links to one peer still open"
    assert a.connection_count(b.node_id) <= const.DUPLICATE_LINKS_DRAINING_MAX + 1


async def test_a_third_link_leaves_the_peers_request_on_a_retired_one_answered(make_manager, fast_net):
    """Both ends dial at once while a request of the peer's is on the link that retires (a relayed
    pair upgrading to direct from both sides; mDNS on a LAN): a third link must not close the
    draining one under it (review r68: closing every older retired link did, "closed (duplicate)")."""
    low, high = await linked_pair(make_manager)
    first = high.link(low.node_id)
    reached, answer = hold_work(low)
    request = asyncio.ensure_future(first.async_request(Frame(FrameType.WORK, {}, b"1"), timeout_s=20))
    await wait_until(reached.is_set, what="the request at the answerer")
    await low.async_connect(addr(high))  # the lower id's dial wins: the first link retires
    await wait_until(lambda: first.retired, what="the first link retired")
    third = await high.async_connect(addr(low))  # a third link (it loses to the lower id's dial)
    await wait_until(lambda: third.retired or not third.is_open, what="the third link ranked")
    answer.set()
    assert (await asyncio.wait_for(request, 10)).payload == b"1"


async def test_a_restarted_peers_retired_links_close_with_its_kept_one(make_manager, fast_net, monkeypatch):
    """The peer restarts while this node has a request on a retired link of its earlier process:
    every link of that process closes at once (review r68: only the kept one did, and the retired
    one's request waited for its deadline, the link 60 s)."""
    a = await make_manager()
    b = await make_manager()
    here, peer = sorted((a, b), key=lambda m: m.node_id)
    await peer.async_connect(addr(here))
    await wait_until(lambda: here.link(peer.node_id) is not None and peer.link(here.node_id) is not None)
    retiring = here.link(peer.node_id)
    hang = asyncio.Event()

    async def never(link, frame):
        await hang.wait()
    peer.register_handler(FrameType.WORK, never)
    request = asyncio.ensure_future(retiring.async_request(Frame(FrameType.WORK, {}, b"x"), timeout_s=30))
    await here.async_connect(addr(peer))  # the lower id's dial wins: the first link retires, the request on it
    await wait_until(lambda: retiring.retired, what="the first link retired")
    kept = here.link(peer.node_id)
    _silent_about_draining(monkeypatch, peer)
    for link in list(peer.links):  # its process dies: its links fall silent
        for task in link._tasks:  # noqa: SLF001
            task.cancel()
    peer.boot_id = "f" * 16  # and its new process dials in
    await peer.async_connect(addr(here))
    try:
        await wait_until(request.done, 5, what="the retired link's request to end")
        with pytest.raises(PeerUnreachable):
            request.result()
        assert retiring.close_cause == kept.close_cause == "peer restarted"
    finally:
        hang.set()


async def test_a_restarted_peers_new_link_wins_whatever_the_clock_says(make_manager, fast_net):
    """The restart rule ranked the two processes' links by wall-clock time: after a clock step back
    (NTP, a VM resumed) the dead process's link won and the new one was closed at every redial
    (review r68). The link being registered is the newer process's: it wins."""
    a = await make_manager()
    b = await make_manager()
    await b.async_connect(addr(a))
    await wait_until(lambda: a.link(b.node_id) is not None and b.link(a.node_id) is not None)
    old = a.link(b.node_id)
    old.established_at += 120  # the clock stepped back after the old link came up
    b.boot_id = "e" * 16
    await b.async_connect(addr(a))
    fresh = await wait_until(lambda: (link := a.link(b.node_id)) is not old and link, 10,
                             what="the new process's link kept")
    assert fresh.hello.boot_id == "e" * 16 and old.close_cause == "peer restarted"


async def test_a_request_on_a_restarted_peers_old_link_fails_at_once(make_manager, fast_net, monkeypatch):
    """A peer restarted (a new boot_id) while its old link is half-open: the old link's requests
    cannot be answered (that process is gone) and fail now, not at their deadlines (they waited up
    to 30 s, the link 60 s)."""
    a = await make_manager()
    b = await make_manager()
    await b.async_connect(addr(a))
    await wait_until(lambda: a.link(b.node_id) is not None and b.link(a.node_id) is not None)
    old_here, old_there = a.link(b.node_id), b.link(a.node_id)
    hang = asyncio.Event()

    async def never(link, frame):  # the old process answers nothing any more
        await hang.wait()
    b.register_handler(FrameType.WORK, never)
    _silent_about_draining(monkeypatch, b)
    for task in old_there._tasks:  # noqa: SLF001 (nor does it ping)
        task.cancel()
    request = asyncio.ensure_future(old_here.async_request(Frame(FrameType.WORK, {}, b"x"), timeout_s=20))
    b.boot_id = "f" * 16  # its new process dials in
    await b.async_connect(addr(a))
    try:
        await wait_until(request.done, 5, what="the old link's request to end")
        with pytest.raises(PeerUnreachable):
            request.result()
        assert not old_here.is_open and old_here.close_cause == "peer restarted"
    finally:
        hang.set()


async def test_a_request_on_a_link_that_said_it_is_drained_is_refused_at_once(make_manager, fast_net):
    """Once an end has said it has nothing more to ask on a retired link, the peer may close it on
    hearing that: a request sent on that link object afterwards (the relay client's loops hold
    theirs) is refused at once, not cut in flight."""
    low, high = await linked_pair(make_manager)
    held = low.link(high.node_id)
    _arrived, answer = hold_work(low)
    first = asyncio.ensure_future(high.link(low.node_id).async_request(Frame(FrameType.WORK, {}, b"1"), timeout_s=20))
    await low.async_connect(addr(high))  # the lower id's dial wins: the first link retires at both ends
    await wait_until(lambda: held.retired and held._drained_sent, what="the held link retired and drained")  # noqa: SLF001
    with pytest.raises(PeerUnreachable, match="retired"):
        await held.async_request(Frame(FrameType.WORK, {}, b"2"), timeout_s=20)
    answer.set()
    assert (await asyncio.wait_for(first, 10)).payload == b"1"


async def test_a_late_handshake_of_a_restarted_peers_earlier_process_does_not_win(make_manager, fast_net, monkeypatch):
    """The peer restarted while a handshake of its earlier process was still being read here (a
    retransmission, a loaded relay): when that handshake completes after the new process's link came
    up, the link being registered is NOT the newer process's; it must not close the live link "peer
    restarted" (review r69). The process a restart ended is remembered and its late link loses."""
    a = await make_manager()
    b = await make_manager()
    await b.async_connect(addr(a))
    await wait_until(lambda: a.link(b.node_id) is not None and b.link(a.node_id) is not None)
    gate, held = asyncio.Event(), asyncio.Event()
    real = a._async_read_hello  # noqa: SLF001
    state: dict = {"armed": True, "stream": None}

    async def read_hello(stream, node_id):
        hello = await real(stream, node_id)
        if state["armed"] and state["stream"] is None:
            state["stream"] = stream  # the earlier process's second dial: its first (minimal) HELLO
        elif stream is state["stream"]:
            held.set()
            await gate.wait()  # its full HELLO is read late
        return hello
    a._async_read_hello = read_hello  # noqa: SLF001
    earlier = b.boot_id
    await b.async_connect(addr(a))  # done at b, not yet at a
    await wait_until(held.is_set, what="a holding the earlier process's full HELLO")
    state["armed"] = False
    for link in list(b.links):  # the earlier process dies: its links go from it, no FIN reaches a
        link.stream.transport.pause_reading()
        monkeypatch.setattr(link.stream, "close", lambda: None)
        monkeypatch.setattr(link.stream, "abort", lambda: None)
        link.close("process died")
    b.boot_id = "f" * 16  # and its new process dials in
    await b.async_connect(addr(a))
    new = await wait_until(lambda: (link := a.link(b.node_id)) is not None and link.hello.boot_id == "f" * 16
                           and link, 10, what="the new process's link kept")
    late: list = []
    real_register = a._register  # noqa: SLF001

    def register(link):
        late.append(link)
        real_register(link)
    a._register = register  # noqa: SLF001
    gate.set()  # the earlier process's handshake completes now
    await wait_until(lambda: late and not late[0].is_open, 10, what="the late link ranked and closed")
    assert late[0].hello.boot_id == earlier and late[0].close_cause == "peer restarted"
    assert new.is_open and a.link(b.node_id) is new
