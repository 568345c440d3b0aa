"""An origin that refuses HEAD (405 Method Not Allowed, as many plain file servers and object
stores' presigned links do) is asked with a GET of the file's first byte before the check gives up
(2026-12-07: it was recorded not public, for good, though anyone could fetch the file there). The
size comes from Content-Range's total. A real aiohttp server on 127.0.0.1 (`lan_ok`) whose route
takes GET only."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from node.inference.synth import write_gguf
from node.models.download.public import async_origin_public
from tests.support.nodes import TINY


class NoHeadOrigin:
    """Serves one file to GET (Range bytes=0-0: a 206 with Content-Range); HEAD: 405."""

    def __init__(self, data: bytes):
        self.data, self.requests = data, []
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/m.gguf", self._get, allow_head=False)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/m.gguf"  # noqa: SLF001

    async def _get(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.headers.get("Range"), request.headers.get("Authorization")))
        if request.headers.get("Range") == "bytes=0-0":
            return web.Response(status=206, body=self.data[:1], content_type="application/octet-stream",
                                headers={"Content-Range": f"bytes 0-0/{len(self.data)}"})
        return web.Response(body=self.data, content_type="application/octet-stream")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_an_origin_refusing_head_is_asked_with_a_ranged_get(tmp_path):
    data = write_gguf(tmp_path / "m.gguf", dataclasses.replace(TINY, seed=43)).read_bytes()
    origin = NoHeadOrigin(data)
    url = await origin.start()
    try:
        assert await async_origin_public(url, sent_token=True, size=len(data), lan_ok=True) is True
        assert [m for m, _r, _a in origin.requests] == ["GET"] and origin.requests[0][1] == "bytes=0-0"
        assert all(a is None for _m, _r, a in origin.requests)
        # another file under that name, or no size known: still not public
        assert await async_origin_public(url, sent_token=True, size=len(data) + 1, lan_ok=True) is False
        assert await async_origin_public(url, sent_token=True, lan_ok=True) is False
    finally:
        await origin.stop()
