"""Starting a second node on the same machine with the same -p (another data dir: the usual way to
try a swarm of two): its peer port (API port + 10) is taken first, and the advice must be about the
port the person chose (-p), not only --peer-port, after which the API port fails in turn; an API
port in use says what to do too, not only "[Errno 98] ... address already in use"."""

from __future__ import annotations

import socket
import subprocess
import sys
from contextlib import contextmanager

from node import const
from tests.support.ports import free_port
from tests.support.processes import REPO, hermetic_env


@contextmanager
def _listening(host, port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen()
    try:
        yield
    finally:
        s.close()


def _run(tmp_path, port):
    return subprocess.run([sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir", str(tmp_path),
                           "--no-mdns", "--no-default-model"], cwd=REPO, env=hermetic_env(),
                          capture_output=True, text=True, timeout=120)


def _error_line(out):
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1, text
    return errors[0]


def test_peer_port_taken_by_another_node_on_the_same_api_port(tmp_path):
    port = free_port()
    with _listening("0.0.0.0", port + const.PEER_PORT_OFFSET):
        line = _error_line(_run(tmp_path, port))
    assert str(port + const.PEER_PORT_OFFSET) in line and " -p" in line, line


def test_api_port_in_use_says_choose_another(tmp_path):
    port = free_port()
    with _listening("127.0.0.1", port):
        line = _error_line(_run(tmp_path, port))
    assert str(port) in line and " -p" in line, line
