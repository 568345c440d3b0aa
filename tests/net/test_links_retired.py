"""Retired duplicate links (review r66 of the drain handshake, 2026-12-07): a retired link waits for
its peer to say it is drained, so whatever that peer never says must not keep it — or keep this
node without a usable link. Real PeerManagers on 127.0.0.1, real TLS."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from node.errors import PeerUnreachable
from node.net import Frame, FrameType
from node.net._link import PeerLink
from tests.support.waiting import wait_until

from .util import addr


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


async def test_a_peer_dialling_again_and_again_leaves_one_draining_link_at_most(make_manager, fast_net, monkeypatch):
    """Each dial of a peer that never says it is drained retired the last one, and every loser stayed
    open for DUPLICATE_LINK_DRAIN_MAX_S: 300 dials in a second held 300 sockets (file descriptors:
    256 by default on macOS)."""
    a = await make_manager()
    b = await make_manager()
    _silent_about_draining(monkeypatch, b)
    await b.async_connect(addr(a))
    await wait_until(lambda: a.link(b.node_id) is not None)
    for _ in range(20):
        await b.async_connect(addr(a))  # (no node id: a new TCP and TLS link each time)
    retired = [link for link in a.links if link.node_id == b.node_id and link.is_open and link.retired]
    assert len(retired) <= 1, f"{len(retired)} retired links to one peer still open"
    assert a.connection_count(b.node_id) <= 2


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
    a = await make_manager()
    b = await make_manager()
    low, high = sorted((a, b), key=lambda m: m.node_id)
    await high.async_connect(addr(low))
    await wait_until(lambda: high.link(low.node_id) is not None and low.link(high.node_id) is not None)
    held, answer = low.link(high.node_id), asyncio.Event()

    async def slow(link, frame):
        await answer.wait()
        return frame.reply(FrameType.RESULT, {}, frame.payload)
    low.register_handler(FrameType.WORK, slow)
    first = asyncio.ensure_future(high.link(low.node_id).async_request(Frame(FrameType.WORK, {}, b"1"), timeout_s=20))
    await low.async_connect(addr(high))  # the lower id's dial wins: the first link retires at both ends
    await wait_until(lambda: held.retired and held._drained_sent, what="the held link retired and drained")  # noqa: SLF001
    with pytest.raises(PeerUnreachable, match="retired"):
        await held.async_request(Frame(FrameType.WORK, {}, b"2"), timeout_s=20)
    answer.set()
    assert (await asyncio.wait_for(first, 10)).payload == b"1"
