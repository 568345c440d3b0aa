"""A member whose clock is days off is still found by mDNS (root; veth + bridge, real zeroconf).

The mDNS tag is a keyed hash of the day and a member accepts the day before and after only: until
2026-12-06 a member whose clock was more than a day off found no LAN peer at all, and said so only at
DEBUG ("mdns found a node of another swarm"). Now the announcement names its day (TXT `d`), such a
member is dialled, and both sides log a WARNING naming the difference in days.
"""

from __future__ import annotations

import re

import pytest

from tests.support.waiting import wait_until

from .netns import Namespaces, netns_unavailable
from .util import PeerProc

pytestmark = [pytest.mark.netns, pytest.mark.slow]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

FAST = ["--const", "PING_INTERVAL_S=0.5", "--const", "DIAL_MAINTENANCE_INTERVAL_S=0.2",
        "--const", "RECONNECT_BACKOFF_MAX_S=1.0"]
DAYS_OFF = 3


@pytest.fixture
def lan(tmp_path):
    spaces = Namespaces("clkskw")
    procs: list[PeerProc] = []
    sw = spaces.add("sw")
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    names = []
    for i in (1, 2):
        ns = spaces.add(f"n{i}")
        spaces.veth(ns, "eth0", sw, f"pn{i}")
        spaces.run(sw, "ip", "link", "set", f"pn{i}", "master", "br0")
        spaces.address(ns, "eth0", f"10.233.0.{i}/24")
        names.append(ns)
    yield names, procs
    for proc in procs:  # processes first: a namespace with a live process lingers
        proc.stop()
    spaces.close()


def _linked(proc: PeerProc, node_id: str) -> bool:
    peer = proc.peer(node_id)
    return bool(peer and peer["state"] == "connected")


async def test_a_member_with_a_clock_days_off_is_found_by_mdns_and_warned_about(lan, tmp_path):
    (ns_a, ns_b), procs = lan
    a = PeerProc(tmp_path, "a", ["--mdns", "--host", "0.0.0.0", *FAST], netns=ns_a)
    procs.append(a)
    b = PeerProc(tmp_path, "b", ["--mdns", "--host", "0.0.0.0", "--clock-offset-s", str(-DAYS_OFF * 86400),
                                 *FAST], netns=ns_b)
    procs.append(b)
    id_a = (await a.async_ready())["node_id"]
    id_b = (await b.async_ready())["node_id"]
    await wait_until(lambda: _linked(a, id_b) and _linked(b, id_a), 60, 0.2,
                     "a and b (its clock 3 days behind) to find each other by mDNS")
    assert "mdns" in set(a.peer(id_b)["sources"]) | set(b.peer(id_a)["sources"])
    # each side warns once, naming the peer and the difference (from mDNS or HELLO, whichever came first)
    for me, peer, days in ((a, id_b, -DAYS_OFF), (b, id_a, DAYS_OFF)):
        await wait_until(lambda m=me, p=peer: f"a peer's clock is far from ours, check the date and time "
                         f"peer_id={p[:8]}" in m.output(), 30, 0.2, "the clock warning")
        lines = [ln for ln in me.output().splitlines() if "a peer's clock is far from ours" in ln]
        assert len(lines) == 1, lines  # once per peer
        skew_s = int(re.search(r"skew_s=(-?\d+)", lines[0]).group(1))
        assert abs(skew_s - days * 86400) < 120, lines
        assert "site=mdns" not in lines[0] or f"skew_days={days}" in lines[0], lines
