"""The self-organising swarm across network namespaces (root; veth + bridge), nothing configured
but `--serve auto`: nodes find each other by mDNS alone, choose their layers, and a node with no
model file answers with llama.cpp's greedy text; and the same with one auto node reachable only
through a relay (route `relayed`)."""

from __future__ import annotations

import json

import pytest

from tests.net.netns import netns_unavailable
from tests.pipeline.swarm import llama_greedy
from tests.pipeline.test_autoserve import BUDGET_MB, auto_model
from tests.pipeline.test_netns import NsNode, lab  # noqa: F401 (the fixture)
from tests.pipeline.test_self_organising import llama_prompt_tokens
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.llama]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

PROMPT = "who holds which layers?"
AUTO = ["--serve", "auto", "--slice-budget-mb", str(BUDGET_MB), "--activation-bits", "32"]


class AutoNsNode(NsNode):
    """An NsNode whose re-evaluation period is short (peer events also trigger one)."""

    def start(self) -> None:
        self.env = {**(self.env or {}), "SWARMLLM_SERVE_REEVALUATE_S": "3"}
        super().start()


def _bridge(spaces, prefix: str, names: list[str]):
    sw = spaces.add("sw")
    spaces.run(sw, "ip", "link", "add", "br0", "type", "bridge")
    spaces.run(sw, "ip", "link", "set", "br0", "up")
    out = []
    for i, name in enumerate(names):
        ns = spaces.add(name)
        spaces.veth(ns, "eth0", sw, f"p{name}")
        spaces.run(sw, "ip", "link", "set", f"p{name}", "master", "br0")
        spaces.address(ns, "eth0", f"{prefix}.{i + 1}/24")
        out.append(ns)
    return out


def test_auto_nodes_found_by_mdns_serve_a_node_without_the_file(lab, tmp_path):  # noqa: F811
    spaces, nodes = lab
    model = auto_model(tmp_path)
    a, *holders = _bridge(spaces, "10.239.0", ["a", "s1", "s2", "s3"])
    for ns in holders:
        nodes.append(AutoNsNode(ns, tmp_path / ns, ["--model", str(model), *AUTO]))
    nodes.append(NsNode(a, tmp_path / "a", ["--activation-bits", "32"]))  # no model at all
    node_a = nodes[-1]
    model_id = node_a.client("wait", "auto8", "150")
    reply = json.loads(node_a.client("chat", model_id, PROMPT, "20"))
    assert reply["status"] == 200, reply
    headers = {k.lower(): v for k, v in reply["headers"].items()}
    assert headers["x-swarm-route"] == "distributed"
    assert int(headers["x-swarm-segments"]) >= 2  # each holder has room for half the model
    assert reply["text"] == llama_greedy(model, PROMPT, 20)
    assert reply["usage"]["prompt_tokens"] == llama_prompt_tokens(model, PROMPT)
    peers = [p for p in json.loads(node_a.client("peers"))["peers"] if p["state"] == "connected"]
    assert len(peers) == 3
    for p in peers:  # found on the LAN, with no address configured anywhere
        assert "bootstrap" not in p["sources"]

    def all_heard() -> bool:  # A's browser hears each announcement (a peer that heard A's first dialled it)
        linked = [p for p in json.loads(node_a.client("peers"))["peers"] if p["state"] == "connected"]
        return len(linked) == 3 and all("mdns" in p["sources"] for p in linked)
    wait_until_sync(all_heard, 30, 0.5, "A to find every holder by mDNS")


def test_auto_nodes_with_one_behind_a_relay(lab, tmp_path):  # noqa: F811
    """A (no model) and S1 share a LAN with relay R; S2 sits behind R (R does not route)."""
    spaces, nodes = lab
    model = auto_model(tmp_path)
    a, s1, r = _bridge(spaces, "10.240.0", ["a", "s1", "r"])
    s2 = spaces.add("s2")
    spaces.veth(s2, "eth0", r, "to_s2")
    spaces.address(s2, "eth0", "10.241.0.2/24")
    spaces.address(r, "to_s2", "10.241.0.1/24")
    spaces.run(r, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    relay_lan, relay_s2 = "10.240.0.3:8810", "10.241.0.1:8810"
    nodes.append(NsNode(r, tmp_path / "r", ["--relay", "--no-mdns"]))
    nodes.append(AutoNsNode(s1, tmp_path / "s1", ["--model", str(model), *AUTO, "--no-mdns", "--relays", relay_lan]))
    nodes.append(AutoNsNode(s2, tmp_path / "s2", ["--model", str(model), *AUTO, "--no-mdns", "--relays", relay_s2]))
    nodes.append(NsNode(a, tmp_path / "a", ["--activation-bits", "32", "--no-mdns", "--relays", relay_lan]))
    node_a = nodes[-1]
    model_id = node_a.client("wait", "auto8", "180")
    reply = json.loads(node_a.client("chat", model_id, PROMPT, "16"))
    assert reply["status"] == 200, reply
    headers = {k.lower(): v for k, v in reply["headers"].items()}
    assert headers["x-swarm-route"] == "relayed"  # S2's half is reachable only through R
    assert headers["x-swarm-segments"] == "2"
    assert reply["text"] == llama_greedy(model, PROMPT, 16)
