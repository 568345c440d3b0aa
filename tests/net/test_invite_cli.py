"""`swarmllm invite --hours H` says how long the code stays valid in words a person can act on:
a code valid for 30 minutes must not be announced as "valid for 0 h", and an --hours below the
minimum is refused in hours (the flag the person typed), not as the API's ttl_s in seconds."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import REPO, NodeProcess, hermetic_env


def _invite(node: NodeProcess, hours: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "invite", "-p", str(node.port), "--data-dir",
                           str(node.data_dir), "--hours", hours], cwd=REPO, env=hermetic_env(),
                          capture_output=True, text=True, timeout=60)


def test_invite_says_how_long_a_short_code_is_valid(tmp_path):
    node = NodeProcess(tmp_path / "a", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        out = _invite(node, "0.5")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("swarmllm1-")
        assert "0 h" not in out.stdout and "30 min" in out.stdout, out.stdout
        # the line after the code, as printed (2026-12-07: "on it run  swarmllm join", a double space)
        assert out.stdout.splitlines()[1] == "(valid for 30 min, for one device: on it, run swarmllm join <code>)", \
            out.stdout
        out = _invite(node, "2")
        assert "2 h" in out.stdout, out.stdout
        out = _invite(node, "0.01")  # 36 s: under the minimum
        assert out.returncode != 0
        assert "--hours" in out.stderr and "ttl_s" not in out.stderr, out.stderr
    finally:
        node.terminate()


def test_invite_into_a_closed_pipe_prints_no_traceback(tmp_path):
    """`swarmllm invite | head -1`: the reader may be gone before the output ends (here it is gone
    before the first byte, so the write fails every time): no BrokenPipeError traceback."""
    node = NodeProcess(tmp_path / "a", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        r, w = os.pipe()
        os.close(r)
        try:
            out = subprocess.run([sys.executable, "-m", "node.cli", "invite", "-p", str(node.port), "--data-dir",
                                  str(node.data_dir)], cwd=REPO, env=hermetic_env(), stdout=w,
                                 stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(w)
        assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr
        assert out.returncode == 1  # the output was cut, as Python advises to report it
    finally:
        node.terminate()
