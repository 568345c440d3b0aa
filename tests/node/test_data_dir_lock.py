"""One node per data dir. A second `swarmllm run` on the data dir of one that runs (the tray app's
node and a terminal's, say, on other ports) would have the same identity — the same node id twice
in the swarm — the same API key and write the same files; it said only "cannot listen for peers …;
choose another with --peer-port", and following that advice started it. Now it is refused, naming
the data dir and the other node's pid; the lock is the OS's, so a killed node leaves none behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from node.datadir import DataDirLock
from tests.support.ports import free_port
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.waiting import wait_until_sync

ARGS = ["--no-default-model", "--no-mdns"]


def _second(data_dir) -> subprocess.CompletedProcess:
    port = free_port()
    return subprocess.run([sys.executable, "-m", "node.cli", "run", "-p", str(port), "--peer-port", str(free_port()),
                           "--data-dir", str(data_dir), *ARGS], cwd=REPO, env=hermetic_env(),
                          capture_output=True, text=True, timeout=90)


def test_a_second_node_on_a_data_dir_in_use_is_refused_and_the_first_keeps_serving(tmp_path):
    first = NodeProcess(tmp_path / "data", args=ARGS)
    try:
        first.wait_ready(path="/health")
        key = first.api_key
        out = _second(first.data_dir)
        assert out.returncode == 2, out.stderr[-2000:]
        said = out.stdout + out.stderr
        assert "another SwarmLLM node" in said and f"pid {first.proc.pid}" in said and str(first.data_dir) in said, \
            said[-2000:]
        assert first.healthy() and first.api_key == key  # untouched
        # node.log is the first node's log: the refused one's lines there must not say a node stopped
        # (it said "node stopping node_id=" and "node stopped" while the first served on)
        log = first.node_log()
        assert "another SwarmLLM node" in log and "node stopping" not in log and "node stopped" not in log, log
        first.kill()  # SIGKILL: no clean stop, yet no stale lock
        wait_until_sync(lambda: not first.alive(), what="the first node gone")
        again = NodeProcess(first.data_dir, args=ARGS)
        try:
            again.wait_ready(path="/health")
            assert again.terminate(signal.SIGTERM) == 0
        finally:
            again.kill()
    finally:
        first.kill()


def test_a_lock_whose_pid_could_not_be_written_is_not_left_held(tmp_path, monkeypatch):
    """The pid is written after the OS lock is taken: a failure there (a full disk) fails the start,
    and the lock goes with it; it stayed held by a file descriptor no one would close, refusing
    every later node of this process on the data dir (its stop finds nothing to release)."""
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    lock = DataDirLock(tmp_path)
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        lock.acquire()
    monkeypatch.setattr(os, "write", real_write)
    lock.release()  # what Node.stop does after a failed start: nothing held by it
    again = DataDirLock(tmp_path)
    again.acquire()  # DataDirInUse if the failed attempt's descriptor still held the lock
    again.release()
