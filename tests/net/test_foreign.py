"""Peers that do not speak SwarmLLM: logged once at INFO, never dialled again (even after a restart)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import pytest

from tests.support.waiting import wait_until

from .util import addr

IGNORING = "Ignoring a peer that does not speak SwarmLLM"


class FakeServer:
    """A TCP server that answers every connection with fixed bytes and counts connections."""

    def __init__(self, answer: bytes):
        self.answer = answer
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self):
        async def handle(reader, writer):
            self.connections += 1
            try:
                await asyncio.wait_for(reader.read(4096), 2)
            except TimeoutError:
                pass
            writer.write(self.answer)
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def _rounds(manager, n: int) -> None:
    target = manager.discovery.dialer.rounds + n
    await wait_until(lambda: manager.discovery.dialer.rounds >= target, what=f"{n} maintenance rounds")


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                                    bytes(range(7, 71)), b"SSH-2.0-OpenSSH_9.6\r\n"],
                         ids=["http", "garbage", "ssh"])
async def test_foreign_bootstrap_is_logged_once_and_never_redialled(make_manager, fast_net, caplog, answer):
    caplog.set_level(logging.DEBUG, logger="node.net")
    async with FakeServer(answer) as fake:
        a = await make_manager("a", bootstrap=[fake.address])
        await wait_until(lambda: IGNORING in caplog.text, what="the foreign peer to be noticed")
        await _rounds(a, 10)
        assert fake.connections == 1
        lines = [r for r in caplog.records if r.getMessage().startswith(IGNORING)]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO
        assert f"addr={fake.address}" in lines[0].getMessage() and "site=bootstrap" in lines[0].getMessage()
        await a.async_stop()
        cache = json.loads((a.config.data_dir / "peers.json").read_text())
        assert fake.address in cache["foreign"]
        a2 = await make_manager("a", bootstrap=[fake.address])  # restart: the cache remembers
        await _rounds(a2, 10)
        assert fake.connections == 1


async def test_peer_with_another_protocol_version_is_ignored(make_manager, fast_net, caplog):
    caplog.set_level(logging.INFO, logger="node.net")
    old = await make_manager("old", start=False)
    real_hello = old._hello
    old._hello = lambda nonce=None, **kw: dataclasses.replace(real_hello(nonce, **kw), version=99,
                                                              agent="swarmllm-py/9.9")
    await old.async_start()
    a = await make_manager("a", bootstrap=[addr(old)])
    await wait_until(lambda: IGNORING in caplog.text)
    await _rounds(a, 10)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith(IGNORING))
    assert "protocol_version=swarmllm/99" in line and "agent=swarmllm-py/9.9" in line
    assert old.node_id in a.discovery.foreign.ids
    assert a.peer(old.node_id) is None and a.link(old.node_id) is None
    dialled = [r for r in caplog.records
               if f"connection established peer_id={a.short_id}" in r.getMessage() and "is_dialer=False" in r.getMessage()]
    assert len(dialled) <= 1  # the one first attempt, never again
