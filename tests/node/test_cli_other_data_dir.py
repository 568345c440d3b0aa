"""`swarmllm models` (or peers, swarm, chat...) with another data dir than the node runs with (the
node was started with --data-dir, the command was not, or the reverse): the command sends the key
of its own data dir, the node answers 401, and the command must say so in its terms: which key
file it used and that --data-dir must match, not the API's "send `Authorization: Bearer <key>`"
(a person running a command sends no header) or a bare "Incorrect API key provided"."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO, NodeProcess, hermetic_env


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = NodeProcess(tmp_path_factory.mktemp("dd") / "node", args=["--no-default-model", "--no-mdns"])
    proc.wait_ready(path="/health")
    yield proc
    proc.terminate()


def _models(node, data_dir):
    return subprocess.run([sys.executable, "-m", "node.cli", "models", "-p", str(node.port), "--data-dir",
                           str(data_dir)], cwd=REPO, env=hermetic_env(), capture_output=True, text=True, timeout=60)


def test_same_data_dir_works(node):
    out = _models(node, node.data_dir)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("other_key", [False, True], ids=["no-key-file", "another-key"])
def test_another_data_dir_says_which_key_and_data_dir(node, tmp_path, other_key):
    if other_key:
        (tmp_path / "api_key").write_text("sk-swarm-" + "0" * 48 + "\n")
    out = _models(node, tmp_path)
    assert out.returncode != 0
    err = out.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert str(tmp_path / "api_key") in err and "--data-dir" in err, err
    assert "Authorization" not in err, err
