"""Remote generate across network namespaces (root; veth + bridge): a whole holder found by mDNS
alone, and one reachable only through a relay (route `relayed`). The coordinator holds nothing of
the model (no file, no slice): it takes the header from the holder and the holder runs it."""

from __future__ import annotations

import json

import pytest

from tests.net.netns import netns_unavailable
from tests.pipeline.swarm import llama_greedy, split_model
from tests.pipeline.test_netns import NsNode, lab  # noqa: F401 (the fixture)
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.llama]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

PROMPT = "tell me about the swarm"


def test_whole_holder_found_by_mdns_alone(lab, tmp_path):  # noqa: F811
    spaces, nodes = lab
    model = split_model(tmp_path)
    sw = spaces.add("sw")
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    for i, name in enumerate(("a", "h")):
        ns = spaces.add(name)
        spaces.veth(ns, "eth0", sw, f"p{name}")
        spaces.run(sw, "ip", "link", "set", f"p{name}", "master", "br0")
        spaces.address(ns, "eth0", f"10.236.0.{i + 1}/24")
        args = [] if name == "a" else ["--model", str(model)]
        nodes.append(NsNode(ns, tmp_path / name, args))
    a = nodes[0]
    model_id = a.client("wait", "split6", "120")
    reply = json.loads(a.client("chat", model_id, PROMPT, "24"))
    assert reply["status"] == 200, reply
    headers = {k.lower(): v for k, v in reply["headers"].items()}
    assert headers["x-swarm-route"] == "distributed" and headers["x-swarm-segments"] == "1"
    [peer] = [p for p in json.loads(a.client("peers"))["peers"] if p["state"] == "connected"]
    assert headers["x-swarm-nodes"] == peer["node_id"][:8]
    assert "bootstrap" not in peer["sources"]
    # whichever side saw the other's announcement first dialled it (the other side's record then says
    # inbound); A's own browser hears H's announcement too, once H's registration is out (~1.7 s
    # after H's start, in the background since 2026-12-06)
    wait_until_sync(lambda: "mdns" in next(p for p in json.loads(a.client("peers"))["peers"]
                                           if p["node_id"] == peer["node_id"])["sources"],
                    30, 0.5, "A to find H by mDNS")
    assert reply["text"] == llama_greedy(model, PROMPT, 24)


def test_whole_holder_behind_a_relay(lab, tmp_path):  # noqa: F811
    """A shares a LAN with relay R; the whole holder H sits behind R (R does not route)."""
    spaces, nodes = lab
    model = split_model(tmp_path)
    sw, a, r, h = (spaces.add(x) for x in ("sw", "a", "r", "h"))
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    for ns, ip in ((a, "10.237.0.1/24"), (r, "10.237.0.3/24")):
        spaces.veth(ns, "eth0", sw, f"p{ns[-1]}")
        spaces.run(sw, "ip", "link", "set", f"p{ns[-1]}", "master", "br0")
        spaces.address(ns, "eth0", ip)
    spaces.veth(h, "eth0", r, "to_h")
    spaces.address(h, "eth0", "10.238.0.2/24")
    spaces.address(r, "to_h", "10.238.0.1/24")
    spaces.run(r, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    nodes.append(NsNode(r, tmp_path / "r", ["--relay", "--no-mdns"]))
    nodes.append(NsNode(a, tmp_path / "a", ["--no-mdns", "--relays", "10.237.0.3:8810"]))
    nodes.append(NsNode(h, tmp_path / "h", ["--model", str(model), "--no-mdns", "--relays", "10.238.0.1:8810"]))
    node_a = nodes[1]
    model_id = node_a.client("wait", "split6", "150")
    reply = json.loads(node_a.client("chat", model_id, PROMPT, "16"))
    assert reply["status"] == 200, reply
    headers = {k.lower(): v for k, v in reply["headers"].items()}
    assert headers["x-swarm-route"] == "relayed" and headers["x-swarm-segments"] == "1"
    assert reply["text"] == llama_greedy(model, PROMPT, 16)
