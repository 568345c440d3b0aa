"""Remote embeddings on real nodes: a node holding no model answers /v1/embeddings for a model two
peers hold whole, through one of them: the official openai client gets the holder's own local
vectors (float and base64), usage and order; the trace says it was remote; a client error the
holder finds (`dimensions`) is the client's 400; a holder stopped mid-request (SIGSTOP) is failed
over to the other one; EMBED frames from a raw peer are bounded and refused with their codes."""

from __future__ import annotations

import base64
import contextlib
import signal
import struct
import time

import aiohttp
import numpy as np
import openai
import pytest

from node import const
from node.inference.pipeline.embed_wire import Embed, Embedded
from node.net import Frame, FrameType, type_name
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.swarm import run, start_coordinator, start_whole_node, wait_for_route, wait_peers
from tests.pipeline.test_remote_generate import whole_model
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

TEXTS = ["the swarm embeds this", "hello world", "a third, longer input about peers and layers and vectors"]


def client(proc: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.base + "/v1", api_key=proc.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("embedremote")
    model = whole_model(base)
    h1 = start_whole_node(base, "h1", model)
    h2 = start_whole_node(base, "h2", model, bootstrap=[h1.peer_port])
    c = start_coordinator(base, h1)
    try:
        async def ready():
            for p in (h1, h2, c):
                await p.async_wait_ready()
            await wait_peers(c, 2)
            return await wait_for_route(c, "whole6")
        model_id = run(ready())
        shorts = {run(p.async_get_json("/api/admin/stats"))["short_id"]: p for p in (h1, h2)}
        yield {"model_id": model_id, "c": c, "holders": shorts}
    finally:
        for p in (c, h2, h1):
            p.terminate()


def _embed(proc: NodeProcess, model_id: str, inputs, **kw):
    raw = client(proc).embeddings.with_raw_response.create(model=model_id, input=inputs, **kw)
    return raw.headers, raw.parse()


def test_vectors_usage_and_order_are_the_holders_own(swarm):
    c, model_id = swarm["c"], swarm["model_id"]
    headers, reply = _embed(c, model_id, TEXTS, encoding_format="float")
    assert headers["x-swarm-route"] == "distributed", dict(headers)
    holder = swarm["holders"][headers["x-swarm-nodes"]]  # the one holder that ran it
    _, local = _embed(holder, model_id, TEXTS, encoding_format="float")
    assert [d.index for d in reply.data] == [0, 1, 2]
    assert reply.usage.prompt_tokens == local.usage.prompt_tokens == reply.usage.total_tokens
    assert reply.model == local.model
    for mine, theirs in zip(reply.data, local.data, strict=True):
        assert len(mine.embedding) == len(theirs.embedding)
        assert np.allclose(mine.embedding, theirs.embedding, atol=1e-6), "vectors differ from the holder's own"
    # base64: the same float32 bytes the holder gives its own clients
    _, b64 = _embed(c, model_id, TEXTS[1], encoding_format="base64")
    _, b64_local = _embed(holder, model_id, TEXTS[1], encoding_format="base64")
    mine = struct.unpack(f"<{len(local.data[1].embedding)}f", base64.b64decode(b64.data[0].embedding))
    assert np.allclose(mine, local.data[1].embedding, atol=1e-6)
    assert np.allclose(mine, struct.unpack(f"<{len(mine)}f", base64.b64decode(b64_local.data[0].embedding)),
                       atol=1e-6)


def test_a_client_error_the_holder_finds_is_the_clients_400(swarm):
    c, model_id = swarm["c"], swarm["model_id"]
    with pytest.raises(openai.BadRequestError) as err:
        client(c).embeddings.create(model=model_id, input="hello", dimensions=7)
    assert err.value.body["param"] == "dimensions" and "7" in err.value.body["message"], err.value.body


def test_a_holder_stopped_mid_request_is_failed_over(swarm):
    c, model_id = swarm["c"], swarm["model_id"]
    headers, _ = _embed(c, model_id, "which holder")
    first = headers["x-swarm-nodes"]
    other = next(short for short in swarm["holders"] if short != first)
    stopped = swarm["holders"][first]
    stopped.send_signal(signal.SIGSTOP)
    try:
        headers, reply = _embed(c, model_id, TEXTS, encoding_format="float")
    finally:
        stopped.send_signal(signal.SIGCONT)
    assert headers["x-swarm-nodes"] == other, dict(headers)
    failed = [line for line in c.node_log().splitlines() if "remote embeddings attempt failed" in line]
    assert failed and f"node={first}" in failed[-1], failed  # it was asked, went silent, was left out
    _, local = _embed(swarm["holders"][other], model_id, TEXTS, encoding_format="float")
    for mine, theirs in zip(reply.data, local.data, strict=True):
        assert np.allclose(mine.embedding, theirs.embedding, atol=1e-6)


def _raw_until(sock, sid: str, timeout_s: float = 20.0) -> Frame:
    """The EMBEDDED end of `sid` from the node (answering its pings meanwhile)."""
    sock.settimeout(timeout_s)
    seen, deadline = [], time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, f"no answer to EMBED {sid}; frames seen: {seen}"
        frame = read_frame(sock)
        seen.append((type_name(frame.type), dict(frame.header)))
        if frame.type == FrameType.PING:
            sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
        elif frame.type == FrameType.EMBEDDED and frame.header.get("sid") == sid and frame.header.get("end"):
            return frame


async def _tokenize(proc: NodeProcess, text: str) -> list[int]:
    async with aiohttp.ClientSession() as s, s.post(proc.base + "/tokenize", json={"content": text},
                                                    headers=proc.auth) as r:
        return (await r.json())["tokens"]


def test_embed_frames_from_a_raw_peer_are_bounded_and_refused_with_their_code(swarm, tmp_path):
    c, model_id = swarm["c"], swarm["model_id"]
    short, h = next(iter(swarm["holders"].items()))
    sha = next(m["sha256"] for p in run(c.async_get_json("/api/admin/peers"))["peers"] for m in p["models"]
               if m.get("whole"))
    raw = RawPeer(tmp_path, "127.0.0.1", h.peer_port)
    me = raw.identity.node_id
    # this model's own ids (the node's API takes no others: check_client_ids); a raw peer's are
    # only bounded and checked against the vocabulary
    ids = tuple(tuple(run(_tokenize(h, text))) for text in TEXTS[1:])
    good = Embed.of("raw/bad", sha, ((1, 2, 3), (4, 5)), me)  # the refusals' frame
    own = Embed.of("raw/ok", sha, ids, me)
    sock, _hello = raw.linked()
    try:
        def ask(header, payload=b"") -> dict:
            sock.sendall(frame_bytes(Frame(FrameType.EMBED, header, payload)))
            return dict(_raw_until(sock, header["sid"]).header)

        many = const.EMBED_REMOTE_MAX_INPUTS + 1
        cases = [
            ({**good.to_header(), "sid": "bad/model", "model": "zz"}, good.payload(), "malformed_embed"),
            ({**good.to_header(), "sid": "bad/len", "lens": [3, 3]}, good.payload(), "malformed_embed"),
            ({**good.to_header(), "sid": "bad/many", "lens": [1] * many}, b"\0" * 4 * many, "malformed_embed"),
            ({**good.to_header(), "sid": "bad/huge", "lens": [const.EMBED_REMOTE_MAX_TOKENS + 1]}, b"",
             "malformed_embed"),
            ({**good.to_header(), "sid": "bad/neg"}, Embed.of("x", sha, ((1, 2, -3), (4, 5)), me).payload(),
             "malformed_embed"),
            ({**good.to_header(), "sid": "bad/coord", "coord": "0" * 64}, good.payload(), "coordinator_mismatch"),
            ({**good.to_header(), "sid": "bad/sha", "model": "0" * 64}, good.payload(), "model_not_held_whole"),
            ({**good.to_header(), "sid": "bad/vocab"}, Embed.of("x", sha, ((1, 2, 99999), (4, 5)), me).payload(),
             "invalid_request"),
            ({**good.to_header(), "sid": "bad/long", "lens": [9000]}, b"\1\0\0\0" * 9000, "context_length_exceeded"),
        ]
        for header, payload, code in cases:
            end = ask(header, payload)
            assert end["end"] == "error" and end["error"]["code"] == code, (header["sid"], end)
        sock.sendall(frame_bytes(Frame(FrameType.EMBED, own.to_header(), own.payload())))
        reply = Embedded.from_frame(dict((frame := _raw_until(sock, own.sid)).header), frame.payload)
    finally:
        sock.close()
    assert reply.end == "ok" and reply.vectors.shape[0] == 2
    local = client(h).embeddings.create(model=model_id, input=[list(t) for t in ids], encoding_format="float")
    assert np.allclose(reply.vectors, [d.embedding for d in local.data], atol=1e-6)
    assert "DIAG: remote embeddings refused" in h.node_log()
    assert raw.ping_ok() and short


def test_a_holder_whose_queue_is_full_gives_the_askers_client_a_429(tmp_path):
    """The only holder refuses every request (`max_queue_per_model = 0`): the client of the node
    without the model gets the holder's 429 (Retry-After), not a 503 saying nobody holds it."""
    model = whole_model(tmp_path)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.toml").write_text("max_queue_per_model = 0\n")
    h = start_whole_node(tmp_path, "h", model)
    c = start_coordinator(tmp_path, h)
    try:
        async def ready():
            for p in (h, c):
                await p.async_wait_ready()
            await wait_peers(c, 1)
            return await wait_for_route(c, "whole6")
        model_id = run(ready())
        with pytest.raises(openai.RateLimitError) as err:
            client(c).embeddings.create(model=model_id, input=TEXTS)
        assert err.value.body["code"] == "overloaded", err.value.body
        assert err.value.response.headers.get("Retry-After") == "1"
        assert "code=overloaded" in h.node_log()
    finally:
        for p in (c, h):
            p.terminate()


def test_a_client_gone_away_stops_the_holders_work(swarm):
    """The asker's client disconnects mid-request: the holder gets EMBED_CANCEL and stops at its next
    run of inputs, releasing the model (not embedding thousands of inputs for nobody)."""
    c, model_id = swarm["c"], swarm["model_id"]
    body = {"model": model_id, "input": [f"{i} " + "peers and layers " * 12 for i in range(2000)]}  # ~200 tokens each

    async def go():
        with contextlib.suppress(TimeoutError):
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.5)) as s, \
                    s.post(c.base + "/v1/embeddings", json=body, headers=c.auth) as r:
                raise AssertionError(f"the request finished within its 1.5 s: {r.status}")

        def stopped():
            logs = [p.node_log() for p in swarm["holders"].values()]
            return any("cancelled by the coordinator" in log and "end=cancelled" in log for log in logs)
        await wait_until(stopped, 60, 0.2, "the holder to stop the cancelled request")
    run(go())
