"""Peers that do not speak SwarmLLM: logged once at INFO, never dialled again (even after a restart)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging

import pytest

from node import const
from node.net._foreign import ForeignPeers
from node.net._messages import NotSwarmPeer
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


async def test_foreign_addresses_are_bounded_oldest_out_and_so_is_peers_json(make_manager, fast_net, monkeypatch):
    """Every misdialled address was remembered for ever, in memory and in peers.json: a node that
    met many (a scanner's, a typo in a script dialling on) grew both without end."""
    monkeypatch.setattr(const, "FOREIGN_PEERS_MAX", 3)
    a = await make_manager("a")
    async with contextlib.AsyncExitStack() as stack:
        fakes = [await stack.enter_async_context(FakeServer(b"HTTP/1.1 400 Bad Request\r\n\r\n")) for _ in range(5)]
        for fake in fakes:  # one at a time: the order they are met in is known
            with pytest.raises(NotSwarmPeer):
                await a.async_connect(fake.address)
        kept = [fake.address for fake in fakes[-3:]]
        assert list(a.discovery.foreign.addrs) == kept
        await a.async_stop()
    assert json.loads((a.config.data_dir / "peers.json").read_text())["foreign"] == kept
    a2 = await make_manager("a", start=False)
    await a2.discovery.cache.async_load()
    assert list(a2.discovery.foreign.addrs) == kept


def test_foreign_ids_and_loaded_addresses_are_bounded(monkeypatch):
    monkeypatch.setattr(const, "FOREIGN_PEERS_MAX", 3)
    foreign = ForeignPeers(lambda: None)
    foreign.load(f"192.0.2.{i}:4000" for i in range(10))  # a peers.json written before the bound
    assert list(foreign.addrs) == [f"192.0.2.{i}:4000" for i in (7, 8, 9)]
    ids = [f"{i:x}" * 64 for i in range(5)]
    for node_id in ids:
        foreign.note_id(node_id)
    assert list(foreign.ids) == ids[-3:]
    foreign.speaks_swarm(ids[-1])
    assert list(foreign.ids) == ids[2:4] and not foreign.skip(ids[-1], "pex") and foreign.skip(ids[2], "pex")
