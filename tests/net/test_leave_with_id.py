"""`swarmllm swarm leave NODE_ID` (meant: make that node leave) is refused, not taken as this node's
own leave: until 2026-12-07 the id was ignored and this node left its swarm, which only a new invite
undoes."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import REPO, NodeProcess, hermetic_env

from .test_refusal_hint import _cli

ARGS = ["--no-default-model", "--no-mdns"]


def test_leave_with_a_node_id_leaves_nothing(tmp_path):
    node = NodeProcess(tmp_path / "owner", args=ARGS)
    try:
        node.wait_ready(path="/health")
        before = json.loads(_cli(node, "swarm", "status", "--json"))["swarm"]
        out = subprocess.run([sys.executable, "-m", "node.cli", "swarm", "leave", "abcd1234", "-p", str(node.port),
                              "--data-dir", str(node.data_dir)], cwd=REPO, env=hermetic_env(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0, out.stdout
        assert "swarmllm swarm remove abcd1234" in out.stderr, out.stderr
        assert json.loads(_cli(node, "swarm", "status", "--json"))["swarm"] == before
        # `swarm status NODE_ID` (wanting that peer's status) is not sent to `swarm remove` (review r77)
        out = subprocess.run([sys.executable, "-m", "node.cli", "swarm", "status", "abcd1234", "-p", str(node.port),
                              "--data-dir", str(node.data_dir)], cwd=REPO, env=hermetic_env(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0 and "remove" not in out.stderr and "swarmllm peers" in out.stderr, out.stderr
    finally:
        node.terminate()
