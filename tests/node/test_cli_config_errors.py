"""A mistake in config.toml or a SWARMLLM_* variable, met by a command that talks to the node
(`swarmllm models`, `swarm`, `chat`, `diagnostics`...): one line naming the mistake, as `swarmllm
run` gives, not a NodeError traceback. These commands read the same settings (port, data dir)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO, hermetic_env

COMMANDS = [["models"], ["peers"], ["swarm"], ["diagnostics"], ["chat", "hi"], ["invite"]]


def _cli(args, data_dir, env=None):
    return subprocess.run([sys.executable, "-m", "node.cli", *args, "--data-dir", str(data_dir)], cwd=REPO,
                          env=hermetic_env(env), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_bad_config_toml_is_one_line(tmp_path, command):
    (tmp_path / "config.toml").write_text("port = 8800\n[api\nhost = 'x'\n")
    out = _cli(command, tmp_path)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "config.toml" in lines[0] and "not valid TOML" in lines[0], lines


def test_bad_environment_value_is_one_line(tmp_path):
    out = _cli(["models"], tmp_path, {"SWARMLLM_PORT": "abc"})
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    assert "port" in out.stderr, out.stderr
