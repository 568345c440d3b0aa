"""A node started with `--bootstrap` at a device of another swarm is told what to do, once: run
`swarmllm invite` on that device and `swarmllm join CODE` here (and the dialled device: invite
here, join there). In the first refusal's log line, `swarmllm swarm status` and `swarmllm peers`."""

from __future__ import annotations

import json
import subprocess
import sys

from node.net import Swarm
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until_sync

JOIN_THERE = "to join that device's swarm: run `swarmllm invite` on it, then `swarmllm join CODE` here"
LET_IN = "to let that device in: run `swarmllm invite` here, then `swarmllm join CODE` on it"


def _cli(node: NodeProcess, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "node.cli", *args, "-p", str(node.port), "--data-dir",
                           str(node.data_dir)], cwd=REPO, env=hermetic_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _refused(node: NodeProcess) -> list[dict]:
    return json.loads(_cli(node, "swarm", "status", "--json"))["refused"]


def test_bootstrapping_into_another_swarm_says_invite_there_and_join_here(tmp_path):
    laptop = NodeProcess(tmp_path / "laptop", args=["--no-default-model", "--no-mdns"])
    join_test_swarm(tmp_path / "desk", Swarm.create())  # its own swarm, as a fresh install has
    desk = NodeProcess(tmp_path / "desk", args=["--no-default-model", "--no-mdns", "--bootstrap",
                                                f"127.0.0.1:{laptop.peer_port}"])
    try:
        laptop.wait_ready(path="/health")
        desk.wait_ready(path="/health")
        wait_until_sync(lambda: _refused(desk) and _refused(laptop), timeout_s=60, what="both refusing")
        [mine] = _refused(desk)
        assert mine.get("hint") == JOIN_THERE and mine["reason"] == "in another swarm"
        assert _refused(laptop)[0].get("hint") == LET_IN
        status = _cli(desk, "swarm", "status")
        assert JOIN_THERE in status, status
        peers = _cli(desk, "peers")
        assert "refused" in peers and peers.count(JOIN_THERE) == 1, peers  # it had said "no peers"
        log = desk.output()
        assert log.count("DIAG: refusing a peer that is not in this swarm") == 1, log
        assert log.count("swarmllm join CODE") == 1, log  # said once, not per redial
    finally:
        desk.terminate()
        laptop.terminate()
