"""A laptop that changes networks (network namespaces, root): node B runs on LAN 1, then its link
moves to LAN 2 with a new address, where node C already runs. Real `swarmllm run` processes, mDNS
only. B must find C on the new LAN without a restart (it did only after one: zeroconf stayed bound
to, and kept announcing, the address B had at start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.processes import REPO, NodeProcess
from tests.support.waiting import wait_until_sync

from .netns import Namespaces, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.slow]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

API_PORT = 25100  # inside each namespace: its own loopback


def _peers(node: NodeProcess) -> list[dict]:
    res = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-m", "tests.pipeline.netclient",
                          "peers", str(API_PORT), str(node.data_dir)], cwd=REPO, capture_output=True, text=True,
                         timeout=30)
    return json.loads(res.stdout)["peers"] if res.returncode == 0 else []


def _linked(node: NodeProcess) -> bool:
    return any(p["state"] == "connected" for p in _peers(node))


@pytest.fixture
def lab():
    spaces = Namespaces("")
    spaces.prefix = f"h6r{os.getpid() % 10000}"
    nodes: list[NodeProcess] = []
    yield spaces, nodes
    for n in nodes:
        n.terminate(timeout_s=20)
    spaces.close()


def test_a_node_that_moves_to_another_lan_finds_the_peers_there(lab, tmp_path):
    spaces, nodes = lab
    sw, b, c = spaces.add("sw"), spaces.add("b"), spaces.add("c")
    for br in ("br1", "br2"):
        spaces.run(sw, "ip", "link", "add", br, "type", "bridge")
        spaces.run(sw, "ip", "link", "set", br, "up")
    for ns, br, ip in ((b, "br1", "10.236.1.2/24"), (c, "br2", "10.236.2.3/24")):
        spaces.veth(ns, "eth0", sw, f"p{ns[-1]}")
        spaces.run(sw, "ip", "link", "set", f"p{ns[-1]}", "master", br)
        spaces.address(ns, "eth0", ip)
    for ns in (b, c):
        nodes.append(NodeProcess(tmp_path / ns[-1], API_PORT, ["--no-default-model", "--n-threads", "1"], netns=ns))
    node_b, node_c = nodes
    wait_until_sync(lambda: all("DIAG: mdns started" in n.output() for n in nodes), 60, 0.2, "both announcements")
    assert not _linked(node_c)  # different LANs: they cannot have met
    # B's laptop moves: its link leaves LAN 1 for LAN 2, where DHCP gives it a new address
    spaces.run(sw, "ip", "link", "set", "pb", "nomaster")
    spaces.run(sw, "ip", "link", "set", "pb", "master", "br2")
    spaces.run(b, "ip", "addr", "flush", "dev", "eth0")
    spaces.address(b, "eth0", "10.236.2.2/24")
    wait_until_sync(lambda: _linked(node_b) and _linked(node_c), 45, 0.5,
                    f"b to find c by mDNS on its new LAN\n--- b ---\n{node_b.output()[-3000:]}")
    addrs = {p["address"].split(":")[0] for p in _peers(node_c)} | {p["address"].split(":")[0] for p in _peers(node_b)}
    assert addrs <= {"10.236.2.2", "10.236.2.3"}, addrs
    # what B tells its peers (HELLO, PEX) follows too: its new address, not the one it had at start
    line = next(x for x in node_b.output().splitlines() if "DIAG: peer listen addresses changed" in x)
    assert "10.236.2.2:" in line and "10.236.1.2" not in line, line


def test_a_node_without_mdns_follows_its_new_address_too(lab, tmp_path):
    """Bootstrap or relay only (--no-mdns): what it tells its peers must follow a move as well (the
    follow loop ran only with mDNS on; review)."""
    spaces, nodes = lab
    sw, b = spaces.add("sw"), spaces.add("b")
    spaces.run(sw, "ip", "link", "add", "br1", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br1", "up")
    spaces.veth(b, "eth0", sw, "pb")
    spaces.run(sw, "ip", "link", "set", "pb", "master", "br1")
    spaces.address(b, "eth0", "10.236.1.2/24")
    nodes.append(NodeProcess(tmp_path / "b", API_PORT, ["--no-default-model", "--n-threads", "1", "--no-mdns"],
                             netns=b))
    node_b = nodes[0]
    wait_until_sync(lambda: "DIAG: peer listener started" in node_b.output(), 60, 0.2, "b's listener")
    spaces.run(b, "ip", "addr", "flush", "dev", "eth0")
    spaces.address(b, "eth0", "10.236.3.2/24")
    wait_until_sync(lambda: "DIAG: peer listen addresses changed" in node_b.output(), 30, 0.2,
                    f"b to take its new address\n{node_b.output()[-2000:]}")
    line = next(x for x in node_b.output().splitlines() if "DIAG: peer listen addresses changed" in x)
    assert "10.236.3.2:" in line and "10.236.1.2" not in line, line
    assert "mdns started" not in node_b.output()  # no mDNS was asked for
