"""Starting a second node on the same machine with the same -p (another data dir: the usual way to
try a swarm of two): its peer port (API port + 10) is taken first, and the advice must be about the
port the person chose (-p), not only --peer-port, after which the API port fails in turn; an API
port in use says what to do too, not only "[Errno 98] ... address already in use". An API port it
may not listen on (below 1024, no rights) or a --host this machine lacks is said as that: any
OSError from the API's bind was taken for the data dir's ("cannot write in the data dir D (error while
attempting to bind on address ('127.0.0.1', 800): permission denied): give a writable directory with
--data-dir")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from contextlib import contextmanager

import pytest

from node import const
from node.errors import Conflict, NodeError
from node.models.download import ModelDownloader
from node.node import Node
from tests.support.nodes import node_config
from tests.support.ports import free_port, port_is_free
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


def _run(tmp_path, port, *args, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir",
                           str(tmp_path), "--no-mdns", "--no-default-model", *args], cwd=REPO, env=hermetic_env(),
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


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to take away the right to listen below 1024")
def test_api_port_below_1024_without_the_right_says_so_not_the_data_dir(tmp_path):
    port = next(p for p in range(1023, 900, -1) if port_is_free(p))
    without_right = ("setpriv", "--bounding-set", "-net_bind_service", "--inh-caps", "-net_bind_service")
    line = _error_line(_run(tmp_path, port, "--peer-port", str(free_port()), prefix=without_right))
    assert f"127.0.0.1:{port}" in line and "permission denied" in line and " -p" in line, line
    assert "data dir" not in line, line


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to take away the right to listen below 1024")
def test_peer_port_below_1024_without_the_right_says_so_not_another_node(tmp_path):
    port = next(p for p in range(1013, 900, -1) if port_is_free(p) and port_is_free(p + 10, "0.0.0.0"))
    without_right = ("setpriv", "--bounding-set", "-net_bind_service", "--inh-caps", "-net_bind_service")
    line = _error_line(_run(tmp_path, port, prefix=without_right))
    assert f":{port + 10}" in line and "ports below 1024" in line and "another node" not in line, line


def test_a_host_this_machine_does_not_have_says_so(tmp_path):
    line = _error_line(_run(tmp_path, free_port(), "--host", "192.0.2.1"))  # TEST-NET-1: no one's
    assert "192.0.2.1" in line and "--host" in line and "Errno" not in line, line


def test_listen_errors_name_their_real_cause():
    """Found in review: a --host name that does not resolve was told to choose another port, and any
    permission denied was blamed on ports below 1024 (Windows reserves port ranges: WinError 10013 is
    EACCES on 8800 too), suggesting the very port that failed."""
    import errno

    from node.api.server import listen_error_text

    unresolved = listen_error_text("my-lapotp", 8800, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert "--host" in unresolved and "another port" not in unresolved, unresolved
    reserved = listen_error_text("127.0.0.1", 8800, PermissionError(errno.EACCES, "Permission denied"))
    assert "1024" not in reserved and "reserves or forbids" in reserved and "e.g. the default 8800" not in reserved
    low = listen_error_text("127.0.0.1", 80, PermissionError(errno.EACCES, "Permission denied"))
    assert "below 1024" in low and "8800" in low


@pytest.mark.asyncio
async def test_a_peer_host_name_that_does_not_resolve_says_so(tmp_path):
    """config.toml's peer_host a name this machine cannot find: it was told to choose another port
    (found in review)."""
    node = Node(node_config(tmp_path / "data", peer_host="no-such-host.invalid"))
    try:
        with pytest.raises(NodeError) as caught:
            await node.start()
    finally:
        await node.stop()
    assert "cannot find the address no-such-host.invalid" in caught.value.message, caught.value.message
    assert "choose another with -p" not in caught.value.message


@pytest.mark.asyncio
async def test_a_set_and_one_of_its_parts_are_not_fetched_twice_into_one_part_file(tmp_path):
    """A whole-set download and a presigned download of one of its parts wrote the same .part (found in
    review): the second is a Conflict naming the part."""
    downloads = ModelDownloader(tmp_path / "models", on_file=None)
    whole = downloads.start("http://127.0.0.1:9/org/big-00001-of-00003.gguf")
    try:
        with pytest.raises(Conflict, match="big-00002-of-00003.gguf"):
            downloads.start("http://127.0.0.1:9/bucket/big-00002-of-00003.gguf?X-Amz-Signature=abc")
    finally:
        downloads.cancel(whole.id)
        await downloads.async_close()
