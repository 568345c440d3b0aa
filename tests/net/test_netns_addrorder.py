"""Which addresses an invite carries on a machine with docker bridges and a VPN (network namespace,
root; a real `swarmllm run` process and the real `swarmllm invite`).

An invite keeps four IPv4 addresses. The laptop here has a VPN (100.64.0.5), three docker bridges
(172.17/172.18/10.99), all created before its Wi-Fi (192.168.1.20, the default route). The invite
must carry the Wi-Fi address, at start and after a roam to another Wi-Fi (192.168.7.20): until
2026-12-06 the start-up order was the interfaces' (the bridges first) and a roam sorted the
addresses as text (10.x, 100.64.x, 172.x before 192.168.x), so the LAN address fell off the invite
and the invited device could not reach the inviter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from node.net._invite import InviteCode
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.waiting import wait_until_sync

from .netns import Namespaces, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.slow]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

API_PORT = 21810  # inside the namespace: its own loopback


@pytest.fixture
def lab():
    spaces = Namespaces("")
    spaces.prefix = f"ao{os.getpid() % 10000}"
    nodes: list[NodeProcess] = []
    yield spaces, nodes
    for n in nodes:
        n.terminate(timeout_s=20)
    spaces.close()


def _invite_addrs(node: NodeProcess) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-m", "node.cli", "invite", "-p",
                          str(node.port), "--data-dir", str(node.data_dir)], cwd=REPO, env=hermetic_env(),
                         capture_output=True, text=True, timeout=60)
    code = re.search(r"swarmllm1-[a-z2-7]+", out.stdout)
    assert code, out.stdout + out.stderr
    return list(InviteCode.decode(code.group(0)).addrs)


def test_an_invite_carries_the_lan_address_before_bridges_and_vpns(lab, tmp_path):
    spaces, nodes = lab
    a, gw = spaces.add("a"), spaces.add("gw")
    for ifname, cidr in (("docker0", "172.17.0.1/16"), ("tailscale0", "100.64.0.5/10"),
                         ("br-1", "10.99.0.1/16"), ("br-2", "172.18.0.1/16")):
        spaces.run(a, "ip", "link", "add", ifname, "type", "bridge")
        spaces.run(a, "ip", "link", "set", ifname, "up")
        spaces.address(a, ifname, cidr)
    spaces.veth(a, "wlan0", gw, "lan")  # the Wi-Fi, created last (its other end: the access point)
    spaces.address(a, "wlan0", "192.168.1.20/24")
    spaces.run(a, "ip", "route", "add", "default", "via", "192.168.1.1")
    node = NodeProcess(tmp_path / "a", API_PORT, ["--no-default-model", "--n-threads", "1", "--no-mdns"], netns=a)
    nodes.append(node)
    # the API starts after the peer listener: `invite` asks the API (the final CI run asked it in between)
    wait_until_sync(lambda: "DIAG: peer listener started" in node.output() and "DIAG: server startup" in node.output(),
                    60, 0.2, "the listener and the API")
    addrs = _invite_addrs(node)
    assert addrs[0].startswith("192.168.1.20:"), addrs
    # the laptop roams to another Wi-Fi: a new lease, a new default route
    spaces.run(a, "ip", "addr", "flush", "dev", "wlan0")
    spaces.address(a, "wlan0", "192.168.7.20/24")
    spaces.run(a, "ip", "route", "add", "default", "via", "192.168.7.1")
    wait_until_sync(lambda: "DIAG: peer listen addresses changed" in node.output(), 30, 0.2,
                    f"the node to take its new address\n{node.output()[-2000:]}")
    addrs = _invite_addrs(node)
    assert addrs[0].startswith("192.168.7.20:"), addrs
    line = next(x for x in node.output().splitlines() if "DIAG: peer listen addresses changed" in x)
    assert re.search(r"addrs=192\.168\.7\.20:\d+,100\.64\.0\.5:", line), line  # then the VPN, bridges last
