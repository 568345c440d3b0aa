"""`swarmllm-tray`: the same options as `swarmllm run`, and a clean exit on SIGTERM and SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
@pytest.mark.parametrize("sig", ["SIGTERM", pytest.param("SIGHUP", marks=pytest.mark.skipif(
    os.name != "posix", reason="POSIX only"))])
def test_a_stop_signal_stops_the_node_and_frees_the_port(tmp_path, tiny_model, sig):
    """SIGTERM (a session's logout, systemd) and SIGHUP (the terminal that started swarmllm-tray
    closed: its default ended the app at once, no clean stop, until 2026-12-06), as `swarmllm run`."""
    port = free_port()
    env = hermetic_env({"QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.main", "-p", str(port), "--data-dir", str(tmp_path / "data"),
         "--no-default-model", "--model", str(tiny_model), "--n-threads", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)) if os.name == "posix" else None)
    # (SIGHUP's default, as a terminal starts it, whatever this test runner was started with: nohup)
    try:
        _wait_ready(port, proc)
        proc.send_signal(getattr(signal, sig))
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert "DIAG: tray quit requested" in output
    assert "DIAG: node stopped" in output and "in_flight=0" in output
    assert port_is_free(port)


@pytest.mark.slow
def test_quit_while_a_large_model_is_hashed_at_start_exits_promptly(tmp_path, tiny_model):
    """Quit (SIGTERM takes the tray's Quit path) while the node still hashes a large model file at
    start: the app exits within seconds, not when the hash is done. Seen: Quit clicked 4 s into
    the start with a 200 GB model took 196 s to take effect (the node's start was awaited first,
    then the process waited for the executor thread still hashing), and a second SIGTERM did
    nothing either; nothing on screen said a quit was pending."""
    big = tmp_path / "big.gguf"
    with open(big, "wb") as out:  # a valid header, then a sparse 100 GB: a minute and more of sha256
        out.write(tiny_model.read_bytes())
        out.truncate(100 * 2**30)
    port = free_port()
    data = tmp_path / "data"
    env = hermetic_env({"QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.main", "-p", str(port), "--data-dir", str(data), "--no-default-model",
         "--model", str(big), "--n-threads", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def started() -> bool:  # the key is written before the catalog scan (the hash) begins
            assert proc.poll() is None, f"the app exited early with {proc.returncode}"
            return (data / "api_key").is_file()
        wait_until_sync(started, 120, 0.05, "the node's start")
        time.sleep(1.0)  # well into the hash
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            pytest.fail("the app was still running 20 s after Quit (hashing the model):\n" + output[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "DIAG: tray quit requested" in output
    assert proc.returncode in (0, 1), output[-3000:]  # 1: the node never came up
    assert port_is_free(port)
