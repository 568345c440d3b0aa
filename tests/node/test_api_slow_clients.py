"""Local clients that hold a connection without finishing a request: a socket opened and left idle, a
request's headers trickled a byte at a time (slowloris), a body shorter than its Content-Length or a
chunked body that stops. aiohttp closes none of them on its own time (an idle connection after 3630 s,
a body never): each held a file descriptor and its handler, and a stalled body up to
max_request_body_bytes of memory. Now an idle connection ends after API_IDLE_CONNECTION_S and a body
that stalls or trickles is a 408 that ends its connection; other clients are served all along."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import zlib

import aiohttp
import pytest

from node import const
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.llama]


@contextlib.asynccontextmanager
async def _node(tmp_path):
    async with running_node(node_config(tmp_path / "data", tiny_model(tmp_path))) as n:
        yield n


async def _served(node) -> bool:
    """Another client is answered (a real completion) while the others hold their sockets."""
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{node.api.port}/v1/chat/completions", headers={"Authorization": f"Bearer {node.api_key}"},
            json={"model": node.models.all()[0].id, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}) as r:
        return r.status == 200 and (await r.json())["object"] == "chat.completion"


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, every_s: float) -> int:
    """Send `data` one byte every `every_s` until the node hangs up; how many bytes went."""
    for sent, byte in enumerate(data):
        if reader.at_eof() or writer.is_closing():
            return sent
        with contextlib.suppress(ConnectionError):
            writer.write(bytes([byte]))
        await asyncio.sleep(every_s)
    return len(data)


def _head(node, length_header: str) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {node.api_key}\r\n"
            f"Content-Type: application/json\r\n{length_header}\r\n").encode()


async def test_idle_and_trickling_connections_are_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "API_IDLE_CONNECTION_S", 1.0, raising=False)  # read when the API starts
    async with _node(tmp_path) as node:
        port = node.api.port
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
        head = _head(node, "Content-Length: 2\r\n")  # one byte of it every 0.2 s: ~30 s in all
        trickle = asyncio.create_task(_trickle(slow_reader, slow_writer, head, 0.2))
        try:
            assert await _served(node)
            await wait_until(lambda: all(r.at_eof() for r, _ in idle), timeout_s=20,
                             what="the node closing 20 idle connections")
            await wait_until(slow_reader.at_eof, timeout_s=20, what="the node closing the slowloris connection")
            assert await asyncio.wait_for(trickle, 5) < len(head)  # cut off before its headers were complete
            assert await _served(node)
        finally:
            trickle.cancel()
            slow_writer.close()
            for _, writer in idle:
                writer.close()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict]:
    raw = await asyncio.wait_for(reader.read(), timeout=20)  # read to EOF: the node also ends the connection
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def test_a_body_that_stops_or_trickles_is_a_408(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "API_BODY_STALL_S", 0.5, raising=False)
    monkeypatch.setattr(const, "API_BODY_READ_MAX_S", 2.0, raising=False)
    async with _node(tmp_path) as node:
        port = node.api.port
        body = json.dumps({"model": node.models.all()[0].id, "max_tokens": 2,
                           "messages": [{"role": "user", "content": "hi " * 20}]}).encode()
        # a Content-Length larger than what is sent; a chunked body that stops after its first chunk
        short_reader, short_writer = await asyncio.open_connection("127.0.0.1", port)
        short_writer.write(_head(node, f"Content-Length: {len(body) + 100}\r\n") + body)
        chunked_reader, chunked_writer = await asyncio.open_connection("127.0.0.1", port)
        chunked_writer.write(_head(node, "Transfer-Encoding: chunked\r\n") + b"%x\r\n%s\r\n" % (len(body[:30]), body[:30]))
        # a body that goes on, one byte every 0.1 s: never stalled, never complete in API_BODY_READ_MAX_S
        trickle_reader, trickle_writer = await asyncio.open_connection("127.0.0.1", port)
        trickle_writer.write(_head(node, f"Content-Length: {len(body)}\r\n"))
        trickling = asyncio.create_task(_trickle(trickle_reader, trickle_writer, body, 0.1))
        try:
            assert await _served(node)
            for reader in (short_reader, chunked_reader, trickle_reader):
                status, error = await _answer(reader)
                assert status == 408 and error["error"]["code"] == "request_timeout", error
            assert await asyncio.wait_for(trickling, 5) < len(body)  # cut off before the body was complete
            assert await _served(node)
        finally:
            trickling.cancel()
            for writer in (short_writer, chunked_writer, trickle_writer):
                writer.close()


def _gzip_of_spaces(n_bytes: int) -> bytes:
    """gzip of n_bytes spaces, made a MiB at a time."""
    encoder, mib = zlib.compressobj(9, zlib.DEFLATED, 31), b" " * (1 << 20)
    return b"".join([*(encoder.compress(mib) for _ in range(n_bytes >> 20)), encoder.flush()])


async def test_compressed_bodies_are_decoded_off_the_loop_and_bounded(tmp_path):
    """A gzip body of 1 GB of spaces (1 MB sent): aiohttp inflated it on the node's loop, ~0.3-0.6 s a
    step (the loop police fails such a step); now a 413 from a decoder that stops at the limit. Bodies
    in gzip and deflate are served as before, one not in its encoding is a 400."""
    bomb = await asyncio.to_thread(_gzip_of_spaces, 1 << 30)
    async with _node(tmp_path) as node, aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{node.api.port}/v1/chat/completions"
        body = json.dumps({"model": node.models.all()[0].id, "max_tokens": 2,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()

        async def post(data: bytes, encoding: str) -> tuple[int, dict]:
            headers = {"Authorization": f"Bearer {node.api_key}", "Content-Type": "application/json",
                       "Content-Encoding": encoding}
            async with session.post(url, data=data, headers=headers) as r:
                return r.status, await r.json()

        status, answer = await post(bomb, "gzip")
        assert status == 413 and answer["error"]["code"] == "payload_too_large", answer
        for data, encoding in ((gzip.compress(body), "gzip"), (zlib.compress(body), "deflate"),
                               (zlib.compress(body)[2:-4], "deflate")):  # raw deflate, as some clients send
            status, answer = await post(data, encoding)
            assert status == 200 and answer["object"] == "chat.completion", (encoding, answer)
        status, answer = await post(body, "gzip")
        assert status == 400 and "could not be read" in answer["error"]["message"], answer
        assert await _served(node)


async def test_gzip_members_one_after_another_are_one_body():
    """RFC 1952 allows several gzip members back to back; aiohttp's decoder took them (found in review:
    the new decoder refused them). Bytes after the stream that are not another member are a 400."""
    from node.api.body_decode import decode_content
    from node.errors import InvalidRequest, PayloadTooLarge

    two = gzip.compress(b'{"a": ') + gzip.compress(b"1}")
    assert decode_content(two, "gzip", 1 << 20) == b'{"a": 1}'
    with pytest.raises(InvalidRequest, match="follow"):
        decode_content(gzip.compress(b"{}") + b"junk", "gzip", 1 << 20)
    with pytest.raises(PayloadTooLarge):
        decode_content(gzip.compress(b" " * 600) + gzip.compress(b" " * 600), "gzip", 1000)
    # a body of ~400k empty members (8 MiB): decoding each copied what followed it, 47 s of CPU that
    # also held the loop (found in review); a body holds at most MAX_MEMBERS
    empty = gzip.compress(b"")
    with pytest.raises(InvalidRequest, match="more than 64"):
        decode_content(empty * (8 * 2**20 // len(empty)), "gzip", 1 << 20)
    assert decode_content(gzip.compress(b"[") + empty * 62 + gzip.compress(b"]"), "gzip", 100) == b"[]"
    spread = gzip.compress(bytes(range(256)) * 2000, compresslevel=0)  # members longer than a read chunk
    assert decode_content(spread + spread, "gzip", 2 << 20) == bytes(range(256)) * 4000


async def test_the_body_count_reads_on_aiohttp_before_3_13():
    """StreamReader.total_raw_bytes is new in aiohttp 3.13 (pyproject allows 3.9): without it every
    POST was a 500 there (found in review)."""
    from types import SimpleNamespace

    from node.api.errors import _received

    assert _received(SimpleNamespace(content=SimpleNamespace(total_bytes=7))) == 7
    assert _received(SimpleNamespace(content=SimpleNamespace(total_bytes=7, total_raw_bytes=9))) == 9
