"""A member removed from its swarm is told so by the members it dials again: `swarmllm swarm status`
and `swarmllm peers` on it say "removed from the swarm", and so does its log. Until 2026-12-07 it
heard only "this node serves only the members of its swarm", from a member of the very swarm its
own status named, and its log line of the refusal gave no reason at all."""

from __future__ import annotations

import json

from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until_sync

from .test_refusal_hint import _cli

REMOVED = "this node was removed from the swarm"


def _refused_by(node: NodeProcess, other: NodeProcess) -> dict | None:
    rows = json.loads(_cli(node, "swarm", "status", "--json"))["refused"]
    return next((r for r in rows if r["node_id"] == _node_id(other) and not r["by_us"]), None)


def _node_id(node: NodeProcess) -> str:
    return json.loads(node.get("/api/admin/stats")[1])["node_id"]


def test_a_removed_member_is_told_it_was_removed(tmp_path):
    owner = NodeProcess(tmp_path / "owner", args=["--no-default-model", "--no-mdns"])
    lost = NodeProcess(tmp_path / "lost", args=["--no-default-model", "--no-mdns", "--bootstrap",
                                                f"127.0.0.1:{owner.peer_port}"])
    try:
        owner.wait_ready(path="/health")
        lost.wait_ready(path="/health")
        lost_id = _node_id(lost)
        wait_until_sync(lambda: any(p["node_id"] == lost_id and p["state"] == "connected" for p in owner.peers()),
                        timeout_s=60, what="the two members linked")
        _cli(owner, "swarm", "remove", lost_id[:8])
        row = wait_until_sync(lambda: _refused_by(lost, owner), timeout_s=60,
                              what="the removed member dialling again and being refused")
        assert REMOVED in row["reason"], row
        assert REMOVED in _cli(lost, "swarm", "status")
        assert REMOVED in _cli(lost, "peers")
        line = next(x for x in lost.node_log().splitlines() if "DIAG: a peer refused this node" in x)
        assert REMOVED in line, line
    finally:
        lost.terminate()
        owner.terminate()
