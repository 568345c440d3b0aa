"""A node's start as Windows (and a data dir on a file system without POSIX modes) would run it,
simulated in-process where Python lets that be honest: the platform test asyncio itself makes
(`os.name`, read by `create_server`), and Windows' permission semantics (`st_mode` 0o666 for any
writable file; chmod sets only the read-only flag).

- The API and peer listeners asked for SO_REUSEADDR explicitly. asyncio leaves it off on Windows
  because there it lets a second program bind the same port: a second node on the same -p would
  have started without "port in use" and shared the connections with the first.
- api_key and identity.key looked "readable by others" at every start on Windows, and each start
  warned that it had tightened them to 0600 (nothing can be: the bits are not kept)."""

from __future__ import annotations

import asyncio.base_events
import logging
import os
import socket
import stat
import types

from tests.support.nodes import node_config, running_node


class _WindowsOs(types.ModuleType):
    """`os` as asyncio's create_server sees it on Windows (only `name` differs)."""

    name = "nt"

    def __getattr__(self, attr):
        return getattr(os, attr)


def _record_reuseaddr(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = socket.socket.setsockopt

    def setsockopt(sock, level, option, *value):
        if level == socket.SOL_SOCKET and option == socket.SO_REUSEADDR:
            seen.append(sock.fileno())
        return real(sock, level, option, *value)

    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)
    return seen


async def _serves(node) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", node.api.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    status = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return status.startswith(b"HTTP/1.1 200")


async def test_on_windows_the_listeners_do_not_ask_for_so_reuseaddr(tmp_path, monkeypatch):
    monkeypatch.setattr(asyncio.base_events, "os", _WindowsOs("os"))
    seen = _record_reuseaddr(monkeypatch)
    async with running_node(node_config(tmp_path / "data")) as node:
        assert await _serves(node)
        assert node.peers.listen_port  # the peer listener is up too
    assert seen == [], "SO_REUSEADDR set on a Windows listener: a second node could bind the same port"


async def test_on_posix_the_listeners_keep_so_reuseaddr(tmp_path, monkeypatch):
    seen = _record_reuseaddr(monkeypatch)
    async with running_node(node_config(tmp_path / "data")) as node:
        assert await _serves(node)
    assert len(seen) >= 2  # the API's and the peer listener's: a restart binds at once (TIME_WAIT)


def _windows_chmod(real_chmod):
    def chmod(path, mode, *args, **kwargs):  # Windows: only the write bit means anything
        real_chmod(path, 0o666 if mode & stat.S_IWUSR else 0o444, *args, **kwargs)
    return chmod


async def test_secret_files_without_posix_modes_start_without_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(os, "chmod", _windows_chmod(os.chmod))
    data = tmp_path / "data"
    async with running_node(node_config(data)):
        pass
    assert all(stat.S_IMODE((data / f).stat().st_mode) == 0o666 for f in ("api_key", "identity.key"))  # as Windows
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        async with running_node(node_config(data)) as node:
            assert await _serves(node)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warned if "readable by others" in w], warned


async def test_secret_files_readable_by_others_are_still_tightened_on_posix(tmp_path, caplog):
    data = tmp_path / "data"
    async with running_node(node_config(data)):
        pass
    for name in ("api_key", "identity.key"):
        os.chmod(data / name, 0o644)
    with caplog.at_level(logging.WARNING):
        async with running_node(node_config(data)):
            pass
    assert all(stat.S_IMODE((data / f).stat().st_mode) == 0o600 for f in ("api_key", "identity.key"))
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "api_key was readable by others" in warned and "identity.key was readable by others" in warned, warned


async def test_data_dir_files_are_opened_binary_where_the_c_runtime_has_text_mode(tmp_path, monkeypatch):
    """Windows' C runtime opens a descriptor in text mode unless os.O_BINARY is given: what Python
    wrote as "\\r\\n" (its own text layer) became "\\r\\r\\n". Every file the node writes through
    os.open must ask for binary mode where the flag exists (0x8000 is Windows' O_BINARY; Linux's
    open takes it as O_LARGEFILE, a no-op on 64 bits)."""
    monkeypatch.setattr(os, "O_BINARY", 0x8000, raising=False)
    data = tmp_path / "data"
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):
        if str(path).startswith(str(data)):
            opened.append((os.path.basename(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    async with running_node(node_config(data)):
        pass
    names = {name.split(".")[0] for name, _ in opened}
    assert {"config", "api_key", "identity", "node"} <= names, opened  # node.lock
    assert [(name, flags) for name, flags in opened if not flags & 0x8000] == []
    async with running_node(node_config(data)) as node:  # what was written reads back
        assert await _serves(node)
