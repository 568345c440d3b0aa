"""A closed terminal (or a dropped ssh session) sends `swarmllm run` SIGHUP: the node stops as for
SIGTERM (the drain, its last log lines, exit 0); under `nohup` (SIGHUP ignored) it serves on.

Found by hand on 2026-12-06: SIGHUP's default ended the process at once, exit -SIGHUP, without
"node stopped": streams under way were cut with no error event and no drain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.nodes import tiny_model
from tests.support.ports import free_port, port_is_free
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX only")]


def test_sighup_stops_the_node_as_sigterm_does(tmp_path):
    proc = NodeProcess(tmp_path / "data", args=["--model", str(tiny_model(tmp_path)), "--no-default-model",
                                                "--no-mdns", "--n-threads", "1"])
    try:
        proc.wait_ready()
        assert proc.terminate(signal.SIGHUP) == 0, proc.output()[-3000:]
        assert "DIAG: node stopped" in proc.output() and "Traceback" not in proc.output()
        assert port_is_free(proc.port)
    finally:
        proc.kill()


def test_a_closing_terminals_two_sighups_still_stop_cleanly(tmp_path):
    """A closing terminal sends SIGHUP twice, milliseconds apart (bash passes it on to its jobs, then
    the kernel sends it to the foreground group): the second is not a user's "now" (found in review:
    it took the immediate-exit path, exit 1, no drain, in 3 of 5 closes)."""
    proc = NodeProcess(tmp_path / "data", args=["--model", str(tiny_model(tmp_path)), "--no-default-model",
                                                "--no-mdns", "--n-threads", "1"])
    try:
        proc.wait_ready()
        proc.proc.send_signal(signal.SIGHUP)
        wait_until_sync(lambda: "DIAG: node stopping" in proc.output() or not proc.alive(), 30,
                        what="the stop to begin")
        assert proc.terminate(signal.SIGHUP) == 0, proc.output()[-3000:]
        assert "DIAG: node stopped" in proc.output() and "exiting now" not in proc.output()
    finally:
        proc.kill()


def test_under_nohup_sighup_is_still_ignored(tmp_path):
    data = tmp_path / "data"
    join_test_swarm(data)
    port = free_port()
    out_path = tmp_path / "out.log"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir", str(data),
                                 "--model", str(tiny_model(tmp_path)), "--no-default-model", "--no-mdns"],
                                cwd=REPO, env=hermetic_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # as nohup does
    try:
        wait_until_sync(lambda: "serving at" in out_path.read_text() or proc.poll() is not None, 120,
                        what="the node to serve")
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGTERM)  # the stop that shows whether SIGHUP began one before it
        assert proc.wait(60) == 0
        output = out_path.read_text()
        assert "SIGTERM while stopping" not in output and "DIAG: node stopped" in output, output[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


_FAILED_START = """
import asyncio, signal, socket, sys
from pathlib import Path
from node.commands.run import serve
from tests.support.nodes import node_config
held = socket.socket()
held.bind(("127.0.0.1", 0))
held.listen()
config = node_config(Path(sys.argv[1]), port=held.getsockname()[1], host="127.0.0.1")
rc = asyncio.run(serve(config))
print("rc", rc, "sighup_ignored", signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
"""


def test_a_failed_start_also_ignores_a_late_hangup(tmp_path):
    """A start that fails (the API port taken: exit 2) leaves SIGHUP ignored as a stopped node does:
    closing the loop restored its default, so a closing terminal's late SIGHUP killed the process
    (2026-12-06: only the path after serving did; the failed start and a stop signal while starting
    did not). Run in its own process: serve() sets the process's signal handlers."""
    done = subprocess.run([sys.executable, "-c", _FAILED_START, str(tmp_path / "data")], cwd=REPO,
                          env=hermetic_env(), capture_output=True, text=True, timeout=120)
    assert "rc 2 sighup_ignored True" in done.stdout, (done.stdout, done.stderr[-3000:])
