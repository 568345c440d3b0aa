"""LAN tests across real interfaces in network namespaces (root; veth + bridge).

1. mDNS alone: two nodes on one bridged LAN, no bootstrap, find each other and link.
2. Relay: A and B sit on separate links to R, which does not forward IP. They meet through R's
   rendezvous, link through a spliced circuit, exchange WORK/RESULT frames whose payload carries a
   marker, and neither the relay's own tap (every byte it forwards) nor a raw packet capture on
   R's interfaces ever contains the marker.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.support.processes import REPO
from tests.support.waiting import wait_until

from .netns import Namespaces, netns_unavailable
from .util import PeerProc

pytestmark = [pytest.mark.netns, pytest.mark.slow]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

MARKER = "MARKER-e1b2-cleartext-would-show-here"
FAST = ["--const", "PING_INTERVAL_S=0.5", "--const", "RELAY_LIST_INTERVAL_S=0.5",
        "--const", "DIAL_MAINTENANCE_INTERVAL_S=0.2", "--const", "RECONNECT_BACKOFF_MAX_S=1.0"]


@pytest.fixture
def netns(request):
    spaces = Namespaces(request.node.name[-6:].replace("_", ""))
    procs: list = []
    yield spaces, procs
    for proc in procs:  # processes first: a namespace with a live process lingers
        if isinstance(proc, PeerProc):
            proc.stop()
        else:
            proc.terminate()
            proc.wait(10)
    spaces.close()


def _start_sniffer(ns: str, out) -> subprocess.Popen:
    """A raw packet capture of every interface in namespace ns (see tests/net/sniff.py)."""
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "tests.net.sniff", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"sniffing"
    return proc


def _connected_via(proc: PeerProc, node_id: str, source: str | None = None) -> bool:
    peer = proc.peer(node_id)
    return bool(peer and peer["state"] == "connected" and (source is None or source in peer["sources"]))


async def test_mdns_alone_finds_the_other_node(netns, tmp_path):
    spaces, procs = netns
    sw, a, b = spaces.add("sw"), spaces.add("a"), spaces.add("b")
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    for ns, ip in ((a, "10.231.0.1/24"), (b, "10.231.0.2/24")):
        spaces.veth(ns, "eth0", sw, f"p{ns[-1]}")
        spaces.run(sw, "ip", "link", "set", f"p{ns[-1]}", "master", "br0")
        spaces.address(ns, "eth0", ip)
    node_a = PeerProc(tmp_path, "a", ["--mdns", "--host", "0.0.0.0", *FAST], netns=a)
    procs.append(node_a)
    node_b = PeerProc(tmp_path, "b", ["--mdns", "--host", "0.0.0.0", *FAST], netns=b)
    procs.append(node_b)
    id_a = (await node_a.async_ready())["node_id"]
    id_b = (await node_b.async_ready())["node_id"]
    await wait_until(lambda: _connected_via(node_a, id_b) and _connected_via(node_b, id_a), 60, 0.2,
                     "a and b to find each other by mDNS")
    sources = set(node_a.peer(id_b)["sources"]) | set(node_b.peer(id_a)["sources"])
    assert "mdns" in sources, sources
    assert "bootstrap" not in sources
    addr = node_a.peer(id_b)["address"] if node_a.peer(id_b)["is_dialer"] else node_b.peer(id_a)["address"]
    assert addr.startswith("10.231.0."), addr  # dialled on the LAN interface, not loopback
    # the announcement may finish after the other side already found it (probing takes ~1.5 s)
    await wait_until(lambda: all("DIAG: mdns started" in p.output() for p in (node_a, node_b)), 30, 0.2,
                     "both announcements")


async def test_relay_connects_unroutable_nodes_and_sees_only_ciphertext(netns, tmp_path):
    spaces, procs = netns
    a, r, b = spaces.add("a"), spaces.add("r"), spaces.add("b")
    spaces.veth(a, "eth0", r, "to_a")
    spaces.veth(b, "eth0", r, "to_b")
    spaces.address(a, "eth0", "10.232.1.2/24")
    spaces.address(r, "to_a", "10.232.1.1/24")
    spaces.address(b, "eth0", "10.232.2.2/24")
    spaces.address(r, "to_b", "10.232.2.1/24")
    spaces.run(r, "sysctl", "-qw", "net.ipv4.ip_forward=0")  # R must not route A <-> B
    capture = tmp_path / "relay-wire.bin"
    sniffer = _start_sniffer(r, capture)
    procs.append(sniffer)
    tap = tmp_path / "relay-tap.bin"
    relay = PeerProc(tmp_path, "r", ["--relay", "--host", "0.0.0.0", "--peer-port", "18810",
                                     "--tap", str(tap), *FAST], netns=r)
    procs.append(relay)
    await relay.async_ready()
    node_b = PeerProc(tmp_path, "b", ["--relays", "10.232.2.1:18810", "--echo", "--host", "0.0.0.0", *FAST],
                      netns=b)
    procs.append(node_b)
    node_a = PeerProc(tmp_path, "a", ["--relays", "10.232.1.1:18810", "--probe", MARKER, "--host", "0.0.0.0",
                                      *FAST], netns=a)
    procs.append(node_a)
    id_b = (await node_b.async_ready())["node_id"]
    id_a = (await node_a.async_ready())["node_id"]
    await wait_until(lambda: (node_a.status() or {}).get("probes", {}).get(id_b) not in (None, "pending"),
                     90, 0.2, "a's WORK frame to reach b and come back")
    assert node_a.status()["probes"][id_b] == "ok", node_a.status()["probes"]
    assert node_a.peer(id_b)["transport"] == "relayed"
    assert node_b.peer(id_a)["transport"] == "relayed"
    assert any(x.startswith("relayed via") for x in node_a.status()["reachable_at"])
    relay.signal(signal.SIGTERM)
    sniffer.send_signal(signal.SIGTERM)
    sniffer.wait(10)
    forwarded = tap.read_bytes()
    wire = capture.read_bytes()
    marker = MARKER.encode()
    payload_len = len(marker + b" ") * 64
    assert len(forwarded) > 2 * payload_len  # the WORK and its RESULT both went through the splice
    assert marker not in forwarded
    assert id_b.encode() in wire  # the capture sees plaintext: the circuit request names its target
    assert marker not in wire
    assert "DIAG: relay circuit opened" in relay.output()


async def test_multi_homed_relay_found_by_mdns_alone(netns, tmp_path):
    """No addresses configured anywhere: A and B each see the relay's mDNS announcement on their own
    link (zeroconf on both of R's interfaces), register there, and meet through it."""
    spaces, procs = netns
    a, r, b = spaces.add("a"), spaces.add("r"), spaces.add("b")
    spaces.veth(a, "eth0", r, "to_a")
    spaces.veth(b, "eth0", r, "to_b")
    spaces.address(a, "eth0", "10.233.1.2/24")
    spaces.address(r, "to_a", "10.233.1.1/24")
    spaces.address(b, "eth0", "10.233.2.2/24")
    spaces.address(r, "to_b", "10.233.2.1/24")
    spaces.run(r, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    common = ["--mdns", "--host", "0.0.0.0", *FAST]
    relay = PeerProc(tmp_path, "r", ["--relay", *common], netns=r)
    procs.append(relay)
    node_a = PeerProc(tmp_path, "a", ["--probe", MARKER, *common], netns=a)
    procs.append(node_a)
    node_b = PeerProc(tmp_path, "b", ["--echo", *common], netns=b)
    procs.append(node_b)
    id_r = (await relay.async_ready())["node_id"]
    id_a = (await node_a.async_ready())["node_id"]
    id_b = (await node_b.async_ready())["node_id"]
    await wait_until(lambda: _connected_via(node_a, id_r, "mdns") and _connected_via(node_b, id_r, "mdns"),
                     60, 0.2, "a and b to find the relay by mDNS")
    assert "10.233.1.2" not in node_b.peer(id_r)["address"] and "10.233.2." in node_b.peer(id_r)["address"]
    await wait_until(lambda: (node_a.status() or {}).get("probes", {}).get(id_b) == "ok", 90, 0.2,
                     "a and b to exchange frames through the relay")
    assert node_a.peer(id_b)["transport"] == "relayed" and node_b.peer(id_a)["transport"] == "relayed"


async def test_two_swarms_on_one_lan_find_only_their_own_by_mdns(netns, tmp_path):
    """Four nodes on one bridged LAN, mDNS only: each pair links within its swarm, and the other
    swarm's announcements (a tag only its members can compute) are not even dialled."""
    from node.net import Swarm
    from tests.support.swarm import join_test_swarm

    spaces, procs = netns
    sw = spaces.add("sw")
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    other = Swarm.create()
    nodes = {}
    for i, name in enumerate(("a1", "a2", "b1", "b2")):
        ns = spaces.add(name)
        spaces.veth(ns, "eth0", sw, f"p{name}")
        spaces.run(sw, "ip", "link", "set", f"p{name}", "master", "br0")
        spaces.address(ns, "eth0", f"10.232.0.{i + 1}/24")
        if name.startswith("b"):
            join_test_swarm(tmp_path / name, other)  # before the process starts: swarm B
        proc = PeerProc(tmp_path, name, ["--mdns", "--host", "0.0.0.0", *FAST], netns=ns)
        procs.append(proc)
        nodes[name] = proc
    ids = {name: (await proc.async_ready())["node_id"] for name, proc in nodes.items()}
    await wait_until(lambda: _connected_via(nodes["a1"], ids["a2"], "mdns") and _connected_via(nodes["b1"], ids["b2"], "mdns"),
                     60, 0.2, "each swarm's pair to find each other by mDNS")
    # proof that the chance came and went: each node saw the other swarm's announcements and said no
    for mine, theirs in (("a1", "b1"), ("a1", "b2"), ("b1", "a1"), ("b2", "a2")):
        await wait_until(lambda m=mine, t=theirs: "mdns found a node of another swarm, not dialling it "
                         f"peer_id={ids[t][:8]}" in nodes[m].output(), 60, 0.2, f"{mine} to pass over {theirs}")
    for mine, theirs in (("a1", "b1"), ("a1", "b2"), ("a2", "b1"), ("a2", "b2")):
        assert nodes[mine].peer(ids[theirs]) is None, (mine, theirs)  # never dialled, not even a record
        assert nodes[theirs].peer(ids[mine]) is None, (theirs, mine)
