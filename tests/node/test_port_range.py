"""A port outside 0..65535 (`-p 70000`, `port = -5` in config.toml, SWARMLLM_PEER_PORT=99999, or an
API port so high that the default peer port, port + 10, is past 65535): one configuration error
line naming the field, exit 2, before anything is loaded; not an OverflowError traceback from
bind() once the models are loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO, hermetic_env


def _run(tmp_path, args, env=None, config=None):
    if config:
        (tmp_path / "config.toml").write_text(config)
    return subprocess.run([sys.executable, "-m", "node.cli", "run", "--data-dir", str(tmp_path), "--no-mdns",
                           "--no-default-model", *args], cwd=REPO, env=hermetic_env(env),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", [
    ("port", ["-p", "70000"], None, None),
    ("port", [], None, "port = -5\n"),
    ("peer_port", ["-p", "0"], {"SWARMLLM_PEER_PORT": "99999"}, None),
    ("peer_port", ["-p", "65530"], None, None),
], ids=["cli-port", "toml-port", "env-peer-port", "derived-peer-port"])
def test_port_out_of_range_is_a_configuration_error(tmp_path, case):
    field, args, env, config = case
    out = _run(tmp_path, args, env, config)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text, text
    assert "configuration error" in text and field in text and "65535" in text, text
