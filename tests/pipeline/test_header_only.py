"""A node without the model file uses the model: two slice nodes hold a split of a random-weight
llama GGUF, a third started with `--no-default-model` and no model at all fetches the header over
the peer link, lists the model, and answers exactly llama.cpp's greedy text for the whole file
with llama.cpp's prompt token count; its header cache survives a restart (no second fetch)."""

from __future__ import annotations

import hashlib

import pytest

from node.models.header import extract_header
from tests.pipeline.swarm import (
    chat,
    llama_greedy,
    run,
    split_model,
    start_slice_node,
    wait_for_route,
    wait_peers,
)
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "what does a node without the file know"


def _prompt_tokens(model, content: str) -> int:
    """llama.cpp's token count of the chat prompt on the whole file."""
    from node.inference.tokenizer import ModelTokenizer

    tok = ModelTokenizer(model)
    try:
        return len(tok.chat_tokens([{"role": "user", "content": content}]))
    finally:
        tok.close()


def _registrations(proc: NodeProcess) -> list[str]:
    return [ln for ln in proc.node_log().splitlines() if "DIAG: registered model from the swarm" in ln]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("headeronly")
    model = split_model(base)
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    bare = NodeProcess(base / "bare", args=["--no-default-model", "--no-mdns", "--n-threads", "1",
                                            "--bootstrap", f"127.0.0.1:{a.peer_port}",
                                            "--bootstrap", f"127.0.0.1:{b.peer_port}"])
    procs = [a, b, bare]
    try:
        async def ready():
            await a.async_wait_ready()
            await b.async_wait_ready()
            await wait_peers(bare, 2)
            await bare.async_wait_ready()  # ready once it can serve the swarm's model
            return await wait_for_route(bare, "split6")
        model_id = run(ready())
        yield {"model": model, "model_id": model_id, "a": a, "b": b, "bare": bare}
    finally:
        for p in procs:
            p.terminate()


def test_bare_node_lists_the_swarm_model_under_the_same_id(swarm):
    async def go():
        listed = await swarm["bare"].async_get_json("/v1/models")
        ids = {m["id"]: m for m in listed["data"]}
        holder = await swarm["a"].async_get_json("/v1/models")
        assert swarm["model_id"] in {m["id"] for m in holder["data"]}
        assert ids[swarm["model_id"]]["route"] == "distributed" and ids[swarm["model_id"]]["state"] == "swarm"
        sha = hashlib.sha256(swarm["model"].read_bytes()).hexdigest()
        assert swarm["model_id"].endswith(sha[:8])  # the FULL file's hash, not the header's
        assert not list((swarm["bare"].data_dir / "models").glob("*.gguf"))
    run(go())


def test_bare_node_answers_llama_cpp_greedy_text_and_prompt_tokens(swarm):
    expected = llama_greedy(swarm["model"], PROMPT, 24)
    n_prompt = _prompt_tokens(swarm["model"], PROMPT)
    assert expected and n_prompt > 0

    async def go():
        import aiohttp

        body = {"model": swarm["model_id"], "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
                "temperature": 0}
        async with aiohttp.ClientSession() as s, s.post(swarm["bare"].base + "/v1/chat/completions", json=body,
                                                        headers=swarm["bare"].auth) as r:
            assert r.status == 200, await r.text()
            assert r.headers["x-swarm-route"] == "distributed"
            assert r.headers["x-swarm-segments"] == "2"
            data = await r.json()
        assert data["choices"][0]["message"]["content"] == expected
        assert data["usage"]["prompt_tokens"] == n_prompt
        status, headers, streamed = await chat(swarm["bare"], swarm["model_id"], PROMPT, max_tokens=24, stream=True)
        assert status == 200 and headers["x-swarm-route"] == "distributed"
        assert streamed == expected
        # by readable name and by sha256 prefix, as for local models
        sha = hashlib.sha256(swarm["model"].read_bytes()).hexdigest()
        for name in ("split6", sha[:12]):
            status, _, text = await chat(swarm["bare"], name, PROMPT, max_tokens=24)
            assert status == 200 and text == expected
    run(go())


def test_header_cached_and_reused_across_a_restart(swarm):
    bare = swarm["bare"]
    sha = hashlib.sha256(swarm["model"].read_bytes()).hexdigest()
    cached = bare.data_dir / "headers" / f"{sha}.gguf-header"
    data, _ = extract_header(swarm["model"])
    assert cached.read_bytes() == data
    before = _registrations(bare)
    assert len(before) == 1 and "source=" in before[0] and "source=cache" not in before[0]
    fetched_before = bare.node_log().count("DIAG: model header fetched")
    assert fetched_before == 1

    bare.terminate()
    bare.start()

    async def go():
        await bare.async_wait_ready()  # ready again only once the cached header is registered
        await wait_for_route(bare, "split6")
        status, _, text = await chat(bare, swarm["model_id"], PROMPT, max_tokens=8)
        assert status == 200, text
    run(go())
    after = _registrations(bare)
    assert len(after) == 2 and "source=cache" in after[1]
    assert bare.node_log().count("DIAG: model header fetched") == fetched_before  # no second fetch


def test_raw_peer_malformed_model_header_requests_get_error_and_the_link_stays(swarm, tmp_path):
    from node.net import Frame, FrameType
    from node.net._frames import frame_bytes
    from tests.net.rawclient import RawPeer, read_frame

    sha = hashlib.sha256(swarm["model"].read_bytes()).hexdigest()
    data, _ = extract_header(swarm["model"])
    peer = RawPeer(tmp_path, "127.0.0.1", swarm["a"].peer_port)
    sock, _hello = peer.linked()

    def ask(header, rid, payload=b""):
        sock.sendall(frame_bytes(Frame(FrameType.MODEL_HEADER, header, payload, rid)))
        while True:
            frame = read_frame(sock)
            if frame.is_response and frame.request_id == rid:
                return frame
    try:
        for rid, (header, code) in enumerate((
                ({}, "invalid_request"), ({"sha256": ["x"]}, "invalid_request"), ({"sha256": "g" * 64}, "invalid_request"),
                ({"sha256": sha, "offset": -5}, "invalid_request"), ({"sha256": sha, "offset": 1.5}, "invalid_request"),
                ({"sha256": sha, "offset": 10**30}, "invalid_request"), ({"sha256": "0" * 64}, "model_not_found"),
                ({"sha256": sha, "junk": "x" * 5000}, None)), start=10):
            reply = ask(header, rid, payload=b"\xff" * 100)
            if code is None:
                assert reply.type == FrameType.MODEL_HEADER and reply.payload == data
                continue
            assert reply.type == FrameType.ERROR and reply.header["code"] == code, (header, reply.header)
        sock.sendall(frame_bytes(Frame(FrameType.PING, {}, b"", 99)))  # the same link still serves
        while True:
            frame = read_frame(sock)
            if frame.request_id == 99 and frame.is_response:
                assert frame.type == FrameType.PONG
                break
    finally:
        sock.close()
    assert swarm["a"].alive()


def test_header_comes_from_the_origin_a_downloaded_model_advertises(tmp_path):
    """W downloads the model (its origin URL is remembered without the query string and advertised);
    a node without the file fetches the header from that origin with one Range request."""
    import aiohttp

    from node.models.header import HEADERS_DIR
    from tests.inference.test_headers import Origin
    from tests.support.nodes import node_config, running_node
    from tests.support.waiting import wait_until

    model = split_model(tmp_path)
    data, _ = extract_header(model)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()

    async def admin(node, method, path, body=None):
        async with aiohttp.ClientSession() as s, s.request(
                method, f"http://127.0.0.1:{node.api.port}{path}", json=body,
                headers={"Authorization": f"Bearer {node.api_key}"}) as r:
            return r.status, await r.json()

    async def go():
        async with Origin(model.read_bytes()) as origin, running_node(node_config(tmp_path / "w")) as w:
            status, body = await admin(w, "POST", "/api/admin/models/download", {"url": origin.url + "?sig=s3cret"})
            assert status == 202, body
            job = body["download"]["id"]

            async def downloaded():
                _, got = await admin(w, "GET", f"/api/admin/downloads/{job}")
                return got["download"]["state"] == "done" and got["download"]["model_id"]
            model_id = await wait_until(downloaded, 60, 0.1, "the download")
            await admin(w, "POST", f"/api/admin/models/{model_id}/load")
            origin.ranges.clear()
            config = node_config(tmp_path / "b", bootstrap=[f"127.0.0.1:{w.peers.listen_port}"])
            async with running_node(config) as b:
                async def registered():  # the catalog takes the entry first, the manager once its tokenizer loaded
                    entry = b.catalog.by_sha(sha)
                    return entry if entry is not None and any(m.id == entry.id for m in b.models.all()) else None
                entry = await wait_until(registered, 60, 0.1, "the model registered from the swarm")
                assert entry.id == model_id and entry.source == "swarm"
                adverts = [m for p in b.peers.peers() for m in p.models if m.get("sha256") == sha]
                assert adverts and adverts[0]["origin_url"] == origin.url  # no query string
                assert origin.ranges == [f"bytes=0-{len(data) - 1}"]
                assert (tmp_path / "b" / HEADERS_DIR / f"{sha}.gguf-header").read_bytes() == data
                assert b.swarm_models.fetches == 1
                served = b.models.get(model_id)
                assert served.tokenizer is not None and not served.whole
    run(go())


def test_a_node_with_no_model_starts_and_is_not_ready_alone(tmp_path):
    from tests.support.nodes import node_config, running_node

    async def go():
        async with running_node(node_config(tmp_path / "alone")) as node:
            assert node.peers is not None and node.api.port
            assert not node.is_ready() and node.list_openai_models() == []
    run(go())
