"""`swarmllm-tray`: the same options as `swarmllm run`, and a clean exit on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request

import pytest

from app.main import build_parser
from node.commands.run import cli_overrides
from node.config import load_config
from tests.support.ports import free_port, port_is_free
from tests.support.processes import REPO, hermetic_env
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.gui


def test_takes_the_node_options_of_swarmllm_run(tmp_path):
    args = build_parser().parse_args(["-p", "9123", "--data-dir", str(tmp_path), "--model", "a.gguf",
                                      "--no-default-model", "-vv", "--cpu-only", "--show"])
    config = load_config(cli_overrides(args), environ={})
    assert (config.port, config.data_dir, config.models) == (9123, tmp_path, ["a.gguf"])
    assert config.include_default_model is False and config.cpu_only is True and config.verbosity == 2
    assert args.show and not args.no_tray


def _wait_ready(port: int, proc: subprocess.Popen, deadline_s: float = 120.0) -> None:
    def ready() -> bool:
        assert proc.poll() is None, f"the app exited early with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False
    wait_until_sync(ready, deadline_s, 0.1, "the app's node to be ready")


@pytest.mark.slow
def test_sigterm_stops_the_node_and_frees_the_port(tmp_path, tiny_model):
    port = free_port()
    env = hermetic_env({"QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.main", "-p", str(port), "--data-dir", str(tmp_path / "data"),
         "--no-default-model", "--model", str(tiny_model), "--n-threads", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_ready(port, proc)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert "DIAG: tray quit requested" in output
    assert "DIAG: node stopped" in output and "in_flight=0" in output
    assert port_is_free(port)
