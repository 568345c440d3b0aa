"""A peer whose clock is far from ours is named in a WARNING, once (real managers on loopback).

Nothing a link needs depends on two clocks agreeing (see node/net/_clock.py), so the link works;
the HELLO's `time` shows the skew for peers reached by bootstrap, PEX or a relay, not only mDNS.
"""

from __future__ import annotations

import secrets

from node import const
from node.net import PeerManager
from tests.support.waiting import wait_until

from .util import addr

MESSAGE = "DIAG: a peer's clock is far from ours"


def _linked(a: PeerManager, b: PeerManager) -> bool:
    return a.link(b.node_id) is not None and b.link(a.node_id) is not None


async def test_hello_time_shows_a_peer_whose_clock_is_hours_off(make_manager, fast_net, caplog):
    caplog.set_level("INFO", logger="node.net")
    a = await make_manager("a")
    b = await make_manager("b", start=False)
    b.clock.offset_s = 2 * 3600.0  # b's clock is two hours ahead
    await b.async_start()
    c = await make_manager("c", bootstrap=[addr(a)])  # a clock that agrees with a's
    await wait_until(lambda: _linked(a, c), 20, what="a and c to link")
    await b.async_connect(addr(a))
    await wait_until(lambda: _linked(a, b), 20, what="a and b to link despite the skew")
    await wait_until(lambda: _linked(b, c), 20, what="b and c to meet through PEX")
    assert abs(a.clock.skews_s[b.node_id] - 7200) < 60 and abs(a.clock.skews_s[c.node_id]) < 60
    lines = [r.getMessage() for r in caplog.records if MESSAGE in r.getMessage()]
    mine = [ln for ln in lines if f"peer_id={b.node_id[:8]}" in ln]
    assert any("site=hello" in ln and "skew_s=7200" in ln and "likely_wrong=peer" in ln for ln in mine), lines
    assert len(mine) == 2 and len(lines) == 4  # once per pair and side: a and c about b, b about a and c
    # b sees two peers two hours behind it, and no one agreeing: its own clock is the likely culprit
    assert any(f"peer_id={c.node_id[:8]}" in ln and "likely_wrong=this_machine" in ln for ln in lines), lines
    assert f"peer_id={a.node_id[:8]} site=hello skew_s=-7200" in "\n".join(lines)


async def test_a_clock_that_agrees_warns_nothing(make_manager, fast_net, caplog):
    caplog.set_level("INFO", logger="node.net")
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: _linked(a, b), 20, what="a and b to link")
    assert abs(a.clock.skews_s[b.node_id]) < 60
    assert MESSAGE not in caplog.text


async def test_a_replayed_mdns_announcement_warns_nothing_until_a_hello(make_manager, fast_net, caplog):
    """A recorded announcement (a member's tag for a day long past) replayed under made-up node ids.
    Until 2026-12-06 each was accepted with a WARNING (after two: `likely_wrong=this_machine`) and
    grew the clock's sets, for a day of any age. Now a day past MDNS_CLOCK_SKEW_MAX_DAYS is refused,
    and a nearer one is dialled (admission decides) with no WARNING and nothing counted."""
    caplog.set_level("INFO", logger="node.net")
    a = await make_manager("a")
    swarm, today = a.membership.swarm, a.clock.day()
    old = today - 30
    fakes = [secrets.token_hex(32) for _ in range(5)]
    assert all(a.clock.accept_mdns(swarm, fake, swarm.mdns_tag(old), str(old)) for fake in fakes)
    assert MESSAGE not in caplog.text
    assert not a.clock.agreeing and not a.clock.skews_s
    ancient = today - const.MDNS_CLOCK_SKEW_MAX_DAYS - 1
    assert not a.clock.accept_mdns(swarm, fakes[0], swarm.mdns_tag(ancient), str(ancient))
    # a member whose announcement named a day 3 days behind is warned about once its HELLO is admitted
    b = await make_manager("b", start=False)
    b.clock.offset_s = -3 * 86400.0
    await b.async_start()
    assert a.clock.accept_mdns(swarm, b.node_id, swarm.mdns_tag(b.clock.day()), str(b.clock.day()))
    assert MESSAGE not in caplog.text
    await a.async_connect(addr(b))
    await wait_until(lambda: _linked(a, b), 20, what="a and b to link")
    await wait_until(lambda: f"peer_id={b.node_id[:8]}" in caplog.text, 10, what="a's warning about b")
    lines = [r.getMessage() for r in caplog.records if MESSAGE in r.getMessage()]
    mine = [ln for ln in lines if f"peer_id={b.node_id[:8]}" in ln and "skew_days=-3" in ln]
    assert len(mine) == 1 and "likely_wrong=unknown" in mine[0], lines
