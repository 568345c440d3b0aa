"""DNS rebinding in the origin check (2026-12-07): the check looked a host up to decide it was
global, then its HTTP request looked it up again, and a name answering a global address first and
127.0.0.1 next had the check ask this machine's own service, and call a file public that only this
node could fetch. The check's connections now use a resolver refusing any address that is not
global (public.py's _GlobalOnlyResolver): what is checked is what is connected to.

A real OriginChecks, catalog and hash cache, a real origin on 127.0.0.1 serving the file to anyone,
and the event loop's name look-ups answered by a stub for the origin's name only: a global address
to the check's own look-ups (before asking, and at the hop), 127.0.0.1 from then on."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE, ModelCatalog
from node.models.hash_cache import HashCache
from node.origin_checks import OriginChecks
from tests.support.nodes import TINY, node_config
from tests.support.waiting import wait_until

NAME = "rebind.swarmllm.test"


class CountingOrigin:
    """An HTTP origin on 127.0.0.1 answering any request with the file's size (200, no body read):
    `connections` counts the TCP connections it accepted."""

    def __init__(self, size: int):
        self.size, self.connections = size, 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {self.size}\r\nContent-Type: application/octet-stream\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_a_name_rebound_to_loopback_after_the_check_is_not_connected_to(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    path = write_gguf(data_dir / MODELS_DIR / "tiny.gguf", TINY)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    origin = CountingOrigin(path.stat().st_size)
    port = await origin.start()
    url = f"http://{NAME}:{port}/org/model/resolve/main/tiny.gguf"
    cache = HashCache(data_dir / HASH_CACHE_FILE)  # a download that sent a token; its check could not be made
    cache.remember(path, sha, url)
    assert cache.set_public(path, sha, None, sent_token=True)

    loop = asyncio.get_running_loop()
    real_getaddrinfo = loop.getaddrinfo
    answered: list[str] = []

    async def rebinding_getaddrinfo(host, port_, *args, **kwargs):
        if host != NAME:
            return await real_getaddrinfo(host, port_, *args, **kwargs)
        address = "1.1.1.1" if len(answered) < 2 else "127.0.0.1"
        answered.append(address)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port_)))]

    monkeypatch.setattr(loop, "getaddrinfo", rebinding_getaddrinfo)
    catalog = ModelCatalog(data_dir)
    await catalog.async_scan([(path, "data_dir")])
    announced: list[int] = []

    async def announce() -> None:
        announced.append(1)

    checks = OriginChecks(node_config(data_dir), catalog, announce)  # public_lan_origins off
    try:
        checks.recheck_unchecked()
        await wait_until(lambda: catalog.unchecked_origins() == [], 30, 0.05, "the check's record")
        await checks.async_stop()
        assert "127.0.0.1" in answered, f"the connection did not look the name up again: {answered}"
        assert origin.connections == 0, "the check connected to 127.0.0.1"
        record = json.loads((data_dir / HASH_CACHE_FILE).read_text(encoding="utf-8"))[str(path.resolve())]
        assert record["public"] is False
        assert not announced and not next(iter(catalog.entries.values())).origin_public
    finally:
        await checks.async_stop()
        await origin.stop()
