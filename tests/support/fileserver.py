"""A local origin for download tests: `FileServer` serves one file over HTTP with Range/ETag support
and misbehaves on request (drops, stalls, errors, ignored or wrong ranges); `serving_file` runs one for
a `with` block; `OTHER` makes a model file other than a node's own."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from aiohttp import web

from tests.support.nodes import TINY

OTHER = dataclasses.replace(TINY, seed=7, name="other")  # a different file than the node's own model


class FileServer:
    """Serves one file at /m.gguf with Range/ETag support, and misbehaves on request."""

    def __init__(self, data: bytes):
        self.data = data
        self.etag = '"v1"'
        self.drop_after: int | None = None  # close the connection after this many body bytes (once)
        self.ignore_range = False
        self.fail_with: list[int] = []  # statuses to answer before serving (one per request)
        self.body_override: bytes | None = None
        self.stall_after: int | None = None  # send this many body bytes, then hang until `release`
        self.release = asyncio.Event()
        self.wrong_range_start = False  # answer a Range request with bytes from the wrong offset (once)
        self.requests: list[dict] = []
        self.sent = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/m.gguf", self.handle)
        app.router.add_get("/models/other.gguf", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
        self.url = f"http://127.0.0.1:{port}/m.gguf"

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"range": request.headers.get("Range"), "if_range": request.headers.get("If-Range")})
        if self.fail_with:
            return web.Response(status=self.fail_with.pop(0), text="busy")
        data = self.body_override if self.body_override is not None else self.data
        start = 0
        rng = request.headers.get("Range")
        if rng and not self.ignore_range and request.headers.get("If-Range") in (None, self.etag):
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            if self.wrong_range_start:
                self.wrong_range_start = False
                start = start // 2
        resp = web.StreamResponse(status=206 if start else 200)
        resp.headers["ETag"] = self.etag
        resp.headers["Accept-Ranges"] = "bytes"
        if start:
            resp.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        resp.content_length = len(data) - start
        await resp.prepare(request)
        body = data[start:]
        if self.stall_after is not None:
            await resp.write(body[:self.stall_after])
            self.sent += self.stall_after
            await self.release.wait()
            if request.transport is not None:  # the client may have gone (cancelled) meanwhile
                request.transport.close()
            return resp
        if self.drop_after is not None:
            cut, self.drop_after = self.drop_after, None
            await resp.write(body[:cut])
            self.sent += cut
            await asyncio.sleep(1.0)  # the client has read what was sent (aiohttp drops unread bytes on error)
            if request.transport is not None:
                request.transport.close()  # mid-body: the client sees a truncated payload
            return resp
        for i in range(0, len(body), 64 * 1024):
            await resp.write(body[i:i + 64 * 1024])
        self.sent += len(body)
        await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def serving_file(data: bytes):
    """A started `FileServer` for `data`; on the way out its stalled answers are let go, then it stops."""
    srv = FileServer(data)
    await srv.start()
    try:
        yield srv
    finally:
        srv.release.set()
        await srv.stop()
