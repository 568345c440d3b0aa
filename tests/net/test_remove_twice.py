"""`swarmllm swarm remove` of a node removed already (run twice, or Remove clicked again on the
removed peer's row, which stays in the Peers tab) says so and changes nothing. Until 2026-12-07 it
rotated the secret again and said "removed": every member away at that moment came back holding an
old secret, refused everywhere until it got a new invite, for a removal that had happened before."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.waiting import wait_until_sync

from .test_refusal_hint import _cli

ARGS = ["--no-default-model", "--no-mdns"]


def _remove(node: NodeProcess, node_id: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "swarm", "remove", node_id, "-p", str(node.port),
                           "--data-dir", str(node.data_dir)], cwd=REPO, env=hermetic_env(), capture_output=True,
                          text=True, timeout=60)


def _epoch(node: NodeProcess) -> int:
    return json.loads(_cli(node, "swarm", "status", "--json"))["epoch"]


def test_removing_a_removed_member_again_rotates_nothing(tmp_path):
    owner = NodeProcess(tmp_path / "owner", args=ARGS)
    lost = NodeProcess(tmp_path / "lost", args=[*ARGS, "--bootstrap", f"127.0.0.1:{owner.peer_port}"])
    try:
        owner.wait_ready(path="/health")
        lost.wait_ready(path="/health")
        lost_id = json.loads(lost.get("/api/admin/stats")[1])["node_id"]
        wait_until_sync(lambda: any(p["node_id"] == lost_id and p["state"] == "connected" for p in owner.peers()),
                        timeout_s=60, what="the two members linked")
        first = _remove(owner, lost_id[:8])
        assert first.returncode == 0, first.stderr
        assert _epoch(owner) == 1
        again = _remove(owner, lost_id[:8])
        assert again.returncode != 0, again.stdout
        assert "removed from this swarm already" in again.stderr, again.stderr
        assert _epoch(owner) == 1  # not rotated again
    finally:
        lost.terminate()
        owner.terminate()
