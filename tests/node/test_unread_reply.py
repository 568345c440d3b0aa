"""A client that sends a non-streaming request and never reads the reply (a hung app). The model's
seat is freed when the reply is ready, but aiohttp then writes the reply after the handler with an
untimed drain: the connection and the reply's bytes (megabytes with logprobs, or embeddings) stayed
for as long as the client's socket stayed open. Now the whole response is written under the
streams' STREAM_WRITE_STALL_S, and a client that takes nothing for that long is cut off."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
import pytest_asyncio

from node import const
from node.inference.synth import write_gguf
from tests.node.test_stalled_reader import SPEC
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("unread-reply")
    async with running_node(node_config(base / "data", write_gguf(base / "stall.gguf", SPEC))) as n:
        yield n


async def test_a_reply_never_read_is_cut_off(node, monkeypatch):
    monkeypatch.setattr(const, "STREAM_WRITE_STALL_S", 1.0, raising=False)
    monkeypatch.setattr(const, "REPLY_MIN_RATE_BYTES_S", 1 << 30, raising=False)  # no time for its length
    served = node.models.all()[0]
    tok = served.tokenizer
    body = json.dumps({
        "model": served.id, "max_tokens": served.n_ctx - 256, "temperature": 1, "seed": 1,
        "logprobs": True, "top_logprobs": 20,  # ~3 KB a token: megabytes, more than the socket buffers take
        "logit_bias": {str(t): -100 for t in range(tok.n_vocab) if tok.is_eog(t)},
        "messages": [{"role": "user", "content": "Tell me everything."}]}).encode()
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", node.api.port))
    await loop.sock_sendall(sock, (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {node.api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    server = node.api.runner.server
    try:
        # ... and reads nothing. The reply is made, its seat freed, and then its connection ends.
        await wait_until(lambda: served.lock.holders == 1, what="the request holding a seat")
        await wait_until(lambda: served.lock.holders == 0, timeout_s=120, what="the reply made and its seat freed")
        await wait_until(lambda: not server.connections, timeout_s=30,
                         what="the node ending the connection of a client that reads nothing")
        trace = next(t for t in reversed(node.traces.recent) if t.operation == "chat.completions")
        assert trace.outcome == "ok" and trace.completion_tokens == served.n_ctx - 256, trace.summary_line()
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{node.api.port}/v1/chat/completions",
                headers={"Authorization": f"Bearer {node.api_key}"},
                json={"model": served.id, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] > 0
    finally:
        sock.close()


async def test_a_slow_reader_that_keeps_reading_gets_the_whole_reply(monkeypatch):
    """A whole reply's send is given time for its length (found in review: a 4 MiB reply read 32 KiB
    every 50 ms was cut off after the stall limit, short of its Content-Length)."""
    from aiohttp import web

    from node.api.streaming import bounded_send_middleware

    monkeypatch.setattr(const, "STREAM_WRITE_STALL_S", 1.0, raising=False)
    body = bytes(range(256)) * (4 * 4096)  # 4 MiB

    async def big(request):
        return web.Response(body=body, content_type="application/octet-stream")

    app = web.Application(middlewares=[bounded_send_middleware])
    app.router.add_get("/big", big)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got = bytearray()
        while True:  # ~640 KB/s: the whole reply takes ~6 s, six times the stall limit
            chunk = await reader.read(32 * 1024)
            if not chunk:
                break
            got += chunk
            await asyncio.sleep(0.05)
        writer.close()
        head, _, rest = bytes(got).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and rest == body
    finally:
        await runner.cleanup()
