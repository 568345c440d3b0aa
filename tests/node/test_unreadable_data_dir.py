"""A data dir this user may not read (one made by `sudo swarmllm run`, or a copy with its modes
lost), met by the real `swarmllm run` and the client commands: one line naming the file and what to
do, exit 2, and the file left as it is.

Found by hand on 2026-12-06: a config.toml the user could not read, or a data dir it could not
enter, ended `swarmllm run` (and `swarmllm models`, and the tray app) in a `PermissionError: [Errno
13] Permission denied: '…/config.toml'` traceback, exit 1; an api_key it could not read did the
same to `swarmllm models` and its kind. Root reads every file, so the node runs
here as root without its capabilities (setpriv): the file modes apply to it as to any user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.processes import REPO, hermetic_env

pytestmark = pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv to run without the right to read every file")

WITHOUT_RIGHTS = ("setpriv", "--bounding-set", "-all", "--inh-caps", "-all")
CONFIG = "# my settings\nn_threads = 1\n"


def _run(data_dir, command="run", *args) -> subprocess.CompletedProcess:
    return subprocess.run([*WITHOUT_RIGHTS, sys.executable, "-m", "node.cli", command, "-p", "0", "--data-dir",
                           str(data_dir), *args], cwd=REPO, env=hermetic_env(), capture_output=True, text=True,
                          timeout=120)


def _one_error(out: subprocess.CompletedProcess) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if " ERROR " in line or line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


@pytest.mark.parametrize("command", ["run", "models"])
def test_a_config_toml_this_user_cannot_read_is_one_line_and_kept(tmp_path, command):
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    config.chmod(0)
    try:
        line = _one_error(_run(tmp_path, command, *(["--no-mdns", "--no-default-model"] if command == "run" else [])))
    finally:
        config.chmod(0o600)
    assert f"cannot read {config} (Permission denied)" in line and "--data-dir" in line, line
    assert config.read_text() == CONFIG


def test_a_data_dir_this_user_cannot_enter_is_one_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text(CONFIG)
    data.chmod(0)
    try:
        line = _one_error(_run(data, "run", "--no-mdns", "--no-default-model"))
    finally:
        data.chmod(0o700)
    assert str(data / "config.toml") in line and "Permission denied" in line, line
    assert (data / "config.toml").read_text() == CONFIG


@pytest.mark.parametrize("command", ["run", "models"])
def test_an_api_key_this_user_cannot_read_is_one_line_and_kept(tmp_path, command):
    key = tmp_path / "api_key"
    key.write_text("sk-swarm-the-one-clients-hold\n")
    key.chmod(0)
    try:
        line = _one_error(_run(tmp_path, command, *(["--no-mdns", "--no-default-model"] if command == "run" else [])))
    finally:
        key.chmod(0o600)
    assert f"cannot read {key} (Permission denied)" in line and "--data-dir" in line, line
    assert key.read_text() == "sk-swarm-the-one-clients-hold\n"
