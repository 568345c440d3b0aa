"""The split model across network namespaces (root; veth + bridge), no configuration:
nodes find each other by mDNS alone; and with one segment reachable only through a relay."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.net.netns import Namespaces, netns_unavailable
from tests.pipeline.swarm import llama_greedy, split_model
from tests.support.processes import REPO, NodeProcess
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.llama]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

PROMPT = "tell me about the swarm"
API_PORT = 8800


class NsNode(NodeProcess):
    """`swarmllm run` inside a namespace (its API on the namespace's own loopback), driven by
    tests.pipeline.netclient run in the same namespace."""

    def __init__(self, ns: str, data_dir, args: list[str]):
        super().__init__(data_dir, API_PORT, ["--no-default-model", "--slice-dtype", "f32", "--n-threads", "1", *args],
                         netns=ns)

    def client(self, *args: str, timeout_s: float = 150) -> str:
        res = subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-m", "tests.pipeline.netclient",
                              args[0], str(API_PORT), str(self.data_dir), *args[1:]],
                             cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        assert res.returncode == 0, f"{res.stderr}\n--- node log ---\n{self.node_log()}"
        return res.stdout.strip()


@pytest.fixture
def lab(request):
    spaces = Namespaces(request.node.name[-5:].replace("_", ""))
    nodes: list[NsNode] = []
    failed_before = request.session.testsfailed
    yield spaces, nodes
    for n in nodes:
        n.terminate(timeout_s=20)
    if request.session.testsfailed > failed_before:  # every node's story (shown with the failure)
        for n in nodes:
            print(f"--- {n.netns} node.log (last 150 lines) ---\n" + "\n".join(n.node_log().splitlines()[-150:]))
    spaces.close()


def test_three_namespaces_mdns_only_match_llama_cpp(lab, tmp_path):
    spaces, nodes = lab
    model = split_model(tmp_path)
    sw = spaces.add("sw")
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    layers = {"a": "0-1", "b": "2-3", "c": "4-5"}
    for i, name in enumerate(layers):
        ns = spaces.add(name)
        spaces.veth(ns, "eth0", sw, f"p{name}")
        spaces.run(sw, "ip", "link", "set", f"p{name}", "master", "br0")
        spaces.address(ns, "eth0", f"10.233.0.{i + 1}/24")
        extra = ["--activation-bits", "32"] if name == "a" else []
        nodes.append(NsNode(ns, tmp_path / name, ["--model", str(model), "--layers", layers[name], *extra]))
    a = nodes[0]
    model_id = a.client("wait", "split6", "120")
    reply = json.loads(a.client("chat", model_id, PROMPT, "24"))
    assert reply["status"] == 200, reply
    headers = {k.lower(): v for k, v in reply["headers"].items()}
    assert headers["x-swarm-route"] == "distributed"
    assert headers["x-swarm-segments"] == "3"
    assert reply["text"] == llama_greedy(model, PROMPT, 24)
    peers = [p for p in json.loads(a.client("peers"))["peers"] if p["state"] == "connected"]
    assert len(peers) == 2
    for p in peers:  # found on the LAN, with no address configured anywhere
        assert "bootstrap" not in p["sources"]
        assert p["address"].startswith("10.233.0.")

    def heard_on_mdns() -> bool:  # (b and c may have dialled a first, having heard a's announcement:
        # a's own browser names them once zeroconf reports them, later on a loaded machine; CI, 2026-12-06)
        return any("mdns" in p["sources"] for p in json.loads(a.client("peers"))["peers"])
    wait_until_sync(heard_on_mdns, 60, what="a to hear its peers on mDNS")


def test_one_hop_through_a_relay(lab, tmp_path):
    """A and B share a LAN; C sits behind relay R (R does not route): the route is `relayed`."""
    spaces, nodes = lab
    model = split_model(tmp_path)
    sw, a, b, r, c = (spaces.add(x) for x in ("sw", "a", "b", "r", "c"))
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    for ns, ip in ((a, "10.234.0.1/24"), (b, "10.234.0.2/24"), (r, "10.234.0.3/24")):
        spaces.veth(ns, "eth0", sw, f"p{ns[-1]}")
        spaces.run(sw, "ip", "link", "set", f"p{ns[-1]}", "master", "br0")
        spaces.address(ns, "eth0", ip)
    spaces.veth(c, "eth0", r, "to_c")
    spaces.address(c, "eth0", "10.235.0.2/24")
    spaces.address(r, "to_c", "10.235.0.1/24")
    spaces.run(r, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    relay_lan, relay_c = "10.234.0.3:8810", "10.235.0.1:8810"
    nodes.append(NsNode(r, tmp_path / "r", ["--relay", "--no-mdns"]))
    nodes.append(NsNode(a, tmp_path / "a", ["--model", str(model), "--layers", "0-1", "--activation-bits", "32",
                                            "--no-mdns", "--relays", relay_lan]))
    nodes.append(NsNode(b, tmp_path / "b", ["--model", str(model), "--layers", "2-3", "--no-mdns",
                                            "--relays", relay_lan]))
    nodes.append(NsNode(c, tmp_path / "c", ["--model", str(model), "--layers", "4-5", "--no-mdns",
                                            "--relays", relay_c]))
    node_a = nodes[1]
    model_id = node_a.client("wait", "split6", "150")
    reply = json.loads(node_a.client("chat", model_id, PROMPT, "16"))
    assert reply["status"] == 200, reply
    headers = {k.lower(): v for k, v in reply["headers"].items()}
    assert headers["x-swarm-route"] == "relayed"
    assert headers["x-swarm-segments"] == "3"
    assert reply["text"] == llama_greedy(model, PROMPT, 16)
