"""`swarmllm join CODE` on a device that needs no join leaves the code and the device's links alone.

Until 2026-12-07 a member given a code of its own swarm (pasted on the wrong device) used it up, so
the device it was for was then refused ("used, expired, or for another swarm"), and it closed every
link of its own, requests in flight included, to come back to the same swarm; and a code made by a
member that had missed a rotation took the joiner back to that member's old secret, cut off from
every member that had the new one."""

from __future__ import annotations

import json
import subprocess
import sys

from node.net import Swarm
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.swarm import TEST_SWARM, join_test_swarm
from tests.support.waiting import wait_until_sync

from .test_refusal_hint import _cli

ARGS = ["--no-default-model", "--no-mdns"]


def _join(node: NodeProcess, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "join", code, "-p", str(node.port), "--data-dir",
                           str(node.data_dir)], cwd=REPO, env=hermetic_env(), capture_output=True, text=True,
                          timeout=60)


def _status(node: NodeProcess) -> dict:
    return json.loads(_cli(node, "swarm", "status", "--json"))


def _node_id(node: NodeProcess) -> str:
    return json.loads(node.get("/api/admin/stats")[1])["node_id"]


def _connection(node: NodeProcess, peer_id: str) -> int | None:
    row = node.peer(peer_id)
    return row["connection_id"] if row and row["state"] == "connected" else None


def test_a_member_given_a_code_of_its_own_swarm_keeps_its_links_and_the_code_stays_open(tmp_path):
    owner = NodeProcess(tmp_path / "owner", args=ARGS)
    member = NodeProcess(tmp_path / "member", args=[*ARGS, "--bootstrap", f"127.0.0.1:{owner.peer_port}"])
    join_test_swarm(tmp_path / "newcomer", Swarm.create())  # a fresh install: a swarm of its own
    newcomer = NodeProcess(tmp_path / "newcomer", args=ARGS)
    try:
        for node in (owner, member, newcomer):
            node.wait_ready(path="/health")
        owner_id = _node_id(owner)
        linked = wait_until_sync(lambda: _connection(member, owner_id), timeout_s=60, what="member linked to owner")
        code = _cli(owner, "invite").splitlines()[0]
        out = _join(member, code)
        assert out.returncode != 0, out.stdout
        assert "a member of that device's swarm already" in out.stderr and "another device can use it" in out.stderr, \
            out.stderr
        assert _status(owner)["invites_open"] == 1  # not used up
        assert _connection(member, owner_id) == linked  # the same link: nothing was closed
        assert "cause=joined swarm" not in member.node_log()
        # the device the code was for still gets in with it
        out = _join(newcomer, code)
        assert out.returncode == 0, out.stderr
        assert _status(newcomer)["swarm"] == _status(owner)["swarm"]
    finally:
        for node in (newcomer, member, owner):
            node.terminate()


def test_a_code_from_a_member_that_missed_a_rotation_does_not_take_the_joiner_back(tmp_path):
    join_test_swarm(tmp_path / "current", TEST_SWARM.rotated())  # epoch 1: a rotation ...
    current = NodeProcess(tmp_path / "current", args=ARGS)
    stale = NodeProcess(tmp_path / "stale", args=ARGS)  # ... this one missed (epoch 0, the old secret)
    try:
        current.wait_ready(path="/health")
        stale.wait_ready(path="/health")
        before = (current.data_dir / "swarm.json").read_text()
        code = _cli(stale, "invite").splitlines()[0]
        out = _join(current, code)
        assert out.returncode != 0, out.stdout
        assert "missed a rotation" in out.stderr and "swarmllm invite` here" in out.stderr, out.stderr
        assert _status(current)["epoch"] == 1
        assert json.loads((current.data_dir / "swarm.json").read_text())["secret"] == json.loads(before)["secret"]
        assert _status(stale)["invites_open"] == 1
    finally:
        stale.terminate()
        current.terminate()
