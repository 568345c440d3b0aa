"""A streaming client that stops reading (a hung app, a paused debugger) and keeps its socket open:
once the socket's buffers are full, every write waits. It held one of the model's seats (of
max_concurrent) for as long as the connection stayed open; now a write that cannot go on for
STREAM_WRITE_STALL_S ends the stream, frees the seat, and other clients are served all along."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
import pytest_asyncio

from node import const
from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

# a small random model with a long context: its reply (~3 KB a token with top_logprobs) outgrows any
# socket buffers (Linux lets a send buffer grow to 4 MB)
SPEC = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=8192, name="stall")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("stalled-reader")
    async with running_node(node_config(base / "data", write_gguf(base / "stall.gguf", SPEC))) as n:
        yield n


async def test_a_client_that_stops_reading_is_cut_off_and_frees_its_seat(node, monkeypatch):
    monkeypatch.setattr(const, "STREAM_WRITE_STALL_S", 1.0, raising=False)
    served = node.models.all()[0]
    tok = served.tokenizer
    body = json.dumps({
        "model": served.id, "stream": True, "max_tokens": served.n_ctx - 256, "temperature": 1, "seed": 1,
        "logprobs": True, "top_logprobs": 20,  # ~3 KB a token: the buffers fill within a few hundred
        "logit_bias": {str(t): -100 for t in range(tok.n_vocab) if tok.is_eog(t)},
        "messages": [{"role": "user", "content": "Tell me everything."}]}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the node's writes wait soon
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", node.api.port))
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {node.api_key}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    await asyncio.get_running_loop().sock_sendall(sock, request)
    try:
        # ... and reads nothing. Meanwhile another client is served, and the stalled one is cut off.
        await wait_until(lambda: served.lock.holders == 1, what="the stalled stream holding a seat")
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{node.api.port}/v1/chat/completions",
                headers={"Authorization": f"Bearer {node.api_key}"},
                json={"model": served.id, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] > 0
        await wait_until(lambda: served.lock.holders == 0 and served.running == set(), timeout_s=60,
                         what="the stalled stream cut off and its seat free")
        trace = next(t for t in reversed(node.traces.recent) if t.operation == "chat.completions" and t.stream)
        assert trace.outcome == "stalled" and trace.completion_tokens < served.n_ctx - 256, trace.summary_line()
    finally:
        sock.close()
