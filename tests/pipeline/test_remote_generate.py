"""Remote generate on real nodes: a node serving a model whole with llama.cpp answers requests made
at another node (the coordinator holds the model only as a one-layer slice, for its tokenizer, so
no chain of slices covers it and the whole holder is the only route): llama.cpp's greedy text,
the trace surfaces, cancellation, failover between two whole holders (SIGKILL and SIGSTOP), and
GENERATE frames from a raw peer refused cleanly."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from node.inference.pipeline.remote_wire import Generate, GenerateCancel, Tokens
from node.inference.sampling import SamplingParams
from node.inference.synth import SynthSpec, write_gguf
from node.net import Frame, FrameType, type_name
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.swarm import (
    chat,
    llama_greedy,
    run,
    start_slice_node,
    start_whole_node,
    stream_and_signal,
    wait_for_route,
    wait_peers,
)
from tests.support.processes import NodeProcess
from tests.support.sse import SseJson
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "tell me about the swarm"
# wide enough that llama.cpp takes some milliseconds per token (a stream can be cut mid-way), f32
WHOLE = SynthSpec(n_layers=6, hidden=512, n_heads=8, n_kv_heads=4, ffn=2048, vocab=512, n_ctx=2048, name="whole6")


def whole_model(directory: Path) -> Path:
    path = directory / "whole6.gguf"
    if not path.exists():
        write_gguf(path, WHOLE)
    return path


async def _ids(procs) -> dict[str, NodeProcess]:
    return {(await p.async_get_json("/api/admin/stats"))["short_id"]: p for p in procs}


def _start(holders: list[NodeProcess], coordinator: NodeProcess):
    async def ready():
        for p in [*holders, coordinator]:
            await p.async_wait_ready()
        await wait_peers(coordinator, len(holders))
        return await wait_for_route(coordinator, "whole6"), await _ids(holders)
    return run(ready())


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("remote")
    model = whole_model(base)
    h = start_whole_node(base, "h", model)
    c = start_slice_node(base, "c", model, "0-0", bootstrap=[h.peer_port], extra=["-v"])  # -v: `pipeline assembled`
    try:
        model_id, by_short = _start([h], c)
        yield {"model": model, "model_id": model_id, "h": h, "c": c, "h_short": next(iter(by_short)), "base": base}
    finally:
        for p in (c, h):
            p.terminate()


async def _idle(*procs) -> None:
    async def idle():
        for p in procs:
            stats = await p.async_get_json("/api/admin/stats")
            if stats["in_flight"] != {"traces": 0, "pipelines": 0} or stats["remote_generations"]:
                return False
        return True
    await wait_until(idle, 20, 0.1, "in_flight and remote generations back to 0")


def test_the_whole_holder_answers_at_the_coordinator_with_its_own_text(pair):
    expected = llama_greedy(pair["model"], PROMPT, 24)
    assert expected

    async def go():
        c, h = pair["c"], pair["h"]
        status, _headers, direct = await chat(h, pair["model_id"], PROMPT, max_tokens=24)
        assert status == 200 and direct == expected

        async def advertised_rate():  # the holder's own decode rate reaches the coordinator's peer table
            peers = (await c.async_get_json("/api/admin/peers"))["peers"]
            return [m["ms_per_token"] for p in peers for m in p["models"] if m.get("whole") and "ms_per_token" in m]
        assert (await wait_until(advertised_rate, 20, 0.1, "the advertised ms_per_token"))[0] > 0
        for stream in (False, True):
            status, headers, text = await chat(c, pair["model_id"], PROMPT, max_tokens=24, stream=stream)
            assert status == 200, text
            assert headers["x-swarm-route"] == "distributed"
            assert headers["x-swarm-segments"] == "1"
            assert headers["x-swarm-nodes"] == pair["h_short"]
            assert text == expected, stream
        await _idle(c, h)
    run(go())

    log = pair["c"].node_log()
    line = [ln for ln in log.splitlines() if "DIAG: request complete" in ln][-1]
    assert "route=distributed segments=1" in line and f"nodes={pair['h_short']}" in line and "outcome=ok" in line
    assert re.search(r"seg0_ms=\d", line) and "assemblies=" not in line
    assembled = [ln for ln in log.splitlines() if "DIAG: pipeline assembled" in ln][-1]
    assert f"segments={pair['h_short']}[0-5]" in assembled
    holder_log = pair["h"].node_log()
    finished = [ln for ln in holder_log.splitlines() if "DIAG: remote generate finished" in ln]
    assert finished and "reason=length" in finished[-1], holder_log
    # the holder's one INFO line per generation (it runs at INFO): `started` is DEBUG (-v)
    assert "DIAG: remote generate started" not in holder_log, holder_log

    async def perf():
        c = pair["c"]
        async with aiohttp.ClientSession() as s, s.get(c.base + "/api/admin/diagnostics", headers=c.auth) as r:
            return await r.text()
    section = run(perf()).split("-- peer serving performance --")[1].split("-- models --")[0]
    coordinator_short = run(pair["c"].async_get_json("/api/admin/stats"))["short_id"]

    async def served_text():
        h = pair["h"]
        async with aiohttp.ClientSession() as s, s.get(h.base + "/api/admin/diagnostics", headers=h.auth) as r:
            return await r.text()
    served = run(served_text()).split("-- served for others --")[1].split("-- peer serving performance --")[0]
    assert "whole models (remote generate) generations=" in served and coordinator_short in served, served
    row = [ln for ln in section.splitlines() if pair["h_short"] in ln]
    assert row and re.search(r"ms_per_layer=\d", row[0]), section  # the planner's measured figure


def test_client_disconnect_cancels_the_holders_generation(pair):
    c, h = pair["c"], pair["h"]

    async def go():
        body = {"model": pair["model_id"], "messages": [{"role": "user", "content": "long"}], "max_tokens": 1500,
                "stream": True, "temperature": 0}
        async with aiohttp.ClientSession() as s:
            resp = await s.post(c.base + "/v1/chat/completions", json=body, headers=c.auth)
            got = 0
            async for _event in SseJson(resp):
                got += 1
                if got >= 4:
                    break
            resp.close()
        await _idle(c, h)
        # the model's lock is free again: the holder serves the next request (its own, and the swarm's)
        status, _headers, text = await chat(h, pair["model_id"], "next", max_tokens=4)
        assert status == 200, text
        status, _headers, text = await chat(c, pair["model_id"], "next", max_tokens=4)
        assert status == 200, text
    run(go())
    finished = [ln for ln in h.node_log().splitlines() if "DIAG: remote generate finished" in ln]
    cancelled = [ln for ln in finished if "reason=cancelled" in ln]
    assert cancelled, finished
    assert int(re.search(r"tokens=(\d+)", cancelled[0]).group(1)) < 1500
    assert "outcome=cancelled" in c.node_log()


def _raw_until(sock, sid: str | None, timeout_s: float = 20.0) -> list[Frame]:
    """Frames from the node until the TOKENS end of `sid` (or an ERROR when sid is None)."""
    sock.settimeout(timeout_s)
    out, seen, deadline = [], [], time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, f"no answer to GENERATE {sid}; frames seen: {seen}"
        frame = read_frame(sock)
        seen.append((type_name(frame.type), dict(frame.header)))
        if frame.type == FrameType.PING:
            sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
            continue
        if sid is None and frame.type == FrameType.ERROR:
            return [frame]
        if frame.type == FrameType.TOKENS and frame.header.get("sid") == sid:
            out.append(frame)
            if frame.header.get("end"):
                return out


def test_generate_frames_from_a_raw_peer(pair, tmp_path):
    """Malformed GENERATE frames get their error and nothing breaks; one for a model the node does
    not hold whole is refused with its code (also at the coordinator, which holds only a slice); a
    good one streams tokens; GENERATE_CANCEL and a dropped link stop the generation."""
    h, c = pair["h"], pair["c"]
    stats = run(h.async_get_json("/api/admin/stats"))
    raw = RawPeer(tmp_path, "127.0.0.1", h.peer_port)
    me = raw.identity.node_id
    full_sha = next(m["sha256"] for m in run(c.async_get_json("/api/admin/peers"))["peers"][0]["models"]
                    if m.get("whole"))
    good = Generate("raw/1", full_sha, (1, 2, 3), SamplingParams(temperature=0.0), 1500, me)
    sock, _hello = raw.linked()
    try:
        def send(header, payload=b""):
            sock.sendall(frame_bytes(Frame(FrameType.GENERATE, header, payload)))

        send({"model": full_sha})  # no session id: an ERROR frame
        [err] = _raw_until(sock, None)
        assert err.header["code"] == "malformed_generate"
        cases = [
            ({**good.to_header(), "sid": "bad/model", "model": "zz"}, good.payload(), "malformed_generate"),
            ({**good.to_header(), "sid": "bad/len", "n": 7}, good.payload(), "malformed_generate"),
            ({**good.to_header(), "sid": "bad/vocab"}, Generate("x", full_sha, (1, 2, 99999), good.sampling, 4,
                                                                 me).payload(), "malformed_generate"),
            ({**good.to_header(), "sid": "bad/sampling", "sampling": {"temperature": "hot"}}, good.payload(),
             "sampling_unsupported"),  # (a value this version refuses: the coordinator tries another node)
            ({**good.to_header(), "sid": "bad/coord", "coord": "0" * 64}, good.payload(), "coordinator_mismatch"),
            ({**good.to_header(), "sid": "bad/sha", "model": "0" * 64}, good.payload(), "model_not_held_whole"),
        ]
        for header, payload, code in cases:
            send(header, payload)
            [end] = _raw_until(sock, header["sid"])
            assert end.header["end"] == "error" and end.header["error"]["code"] == code, (header["sid"], end.header)
        # a good one streams tokens in order; GENERATE_CANCEL stops it
        send(good.to_header(), good.payload())
        first = read_tokens(sock, good.sid)
        assert first.tokens and first.first == 0
        sock.sendall(frame_bytes(Frame(FrameType.GENERATE_CANCEL, GenerateCancel(good.sid).to_header())))
        run(_wait_remote_idle(h))
        # a second one, then the link drops: the holder stops by itself
        again = Generate("raw/2", full_sha, (1, 2, 3), SamplingParams(temperature=0.0), 1500, me)
        send(again.to_header(), again.payload())
        assert read_tokens(sock, again.sid).tokens
    finally:
        sock.close()
    run(_wait_remote_idle(h))
    log = h.node_log()
    assert "DIAG: remote generate refused" in log and "code=coordinator_mismatch" in log
    assert "cancelled by the coordinator" in log  # GENERATE_CANCEL
    # the link dropped: seen by the peer table, or by the next TOKENS that could not be sent
    assert "link to the coordinator dropped" in log or "the coordinator is unreachable" in log
    assert raw.ping_ok()  # the node still serves peers
    assert run(h.async_get_json("/api/admin/stats"))["node_id"] == stats["node_id"]

    # the coordinator holds the model only as a slice: it refuses to run it whole
    raw_c = RawPeer(tmp_path / "c", "127.0.0.1", c.peer_port)
    sock, _hello = raw_c.linked()
    try:
        gen = Generate("raw/3", full_sha, (1, 2, 3), SamplingParams(temperature=0.0), 4, raw_c.identity.node_id)
        sock.sendall(frame_bytes(Frame(FrameType.GENERATE, gen.to_header(), gen.payload())))
        [end] = _raw_until(sock, gen.sid)
        assert end.header["error"]["code"] == "model_not_held_whole"
    finally:
        sock.close()


def read_tokens(sock, sid: str) -> Tokens:
    """The first TOKENS frame of `sid` that carries tokens."""
    sock.settimeout(20)
    deadline = time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline, f"no tokens for {sid}"
        frame = read_frame(sock)
        if frame.type == FrameType.PING:
            sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
        elif frame.type == FrameType.TOKENS and frame.header.get("sid") == sid:
            msg = Tokens.from_frame(frame.header, frame.payload)
            assert msg.end is None, frame.header
            if msg.tokens:
                return msg


async def _wait_remote_idle(h: NodeProcess) -> None:
    async def idle():
        return (await h.async_get_json("/api/admin/stats"))["remote_generations"] == 0
    await wait_until(idle, 20, 0.1, "the holder's remote generations back to 0")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_failover_between_two_whole_holders_keeps_the_text(tmp_path, sig):
    model = whole_model(tmp_path)
    h1 = start_whole_node(tmp_path, "h1", model)
    h2 = start_whole_node(tmp_path, "h2", model)
    c = start_slice_node(tmp_path, "c", model, "0-0", bootstrap=[h1.peer_port, h2.peer_port])
    procs, victim = [h1, h2, c], None
    try:
        model_id, by_short = _start([h1, h2], c)
        expected = llama_greedy(model, PROMPT, 80)

        started = time.monotonic()
        res = run(stream_and_signal(c, model_id, PROMPT, 80, lambda nodes: by_short[nodes[0]], after=3, sig=sig))
        assert res.outcome == "ok", res.error
        assert res.headers["x-swarm-segments"] == "1"
        victim, text = res.signalled, res.text
        assert victim is not None
        assert text == expected  # no repeated or missing token across the failover

        def summary():
            found = [ln for ln in c.node_log().splitlines() if "DIAG: request complete" in ln]
            return found[-1] if found else None
        line = run(wait_until(summary, 10, 0.05, "the request's summary line"))
        assert "assemblies=2" in line and "outcome=ok" in line and "segments=1" in line
        failed = [ln for ln in c.node_log().splitlines() if "DIAG: pipeline attempt failed" in ln]
        assert len(failed) == 1, failed
        if sig == signal.SIGKILL:
            assert "cause=link_drop" in failed[0], failed
        else:
            # A stopped holder keeps its socket: the silence budget (GENERATE_SILENCE_S + the ACK
            # budget, ~2.1 s) or the link's pings (3 missed, 1.8 s from the first one after the
            # stop) find it, whichever comes first with the ping's phase (a CI run saw the pings
            # win); never the 13 s peer-gone deadline. The silence budget alone: test_remote_wire.
            timed_out = "remote generate TIMED OUT" in c.node_log()
            pinged_out = "peer missed pings, closing link" in c.node_log()
            assert ("cause=tokens_deadline" in failed[0] and timed_out) or \
                ("cause=link_drop" in failed[0] and pinged_out), failed
            assert time.monotonic() - started < 30
        survivor = h2 if victim is h1 else h1
        run(_idle(c, survivor))
    finally:
        if victim is not None and sig == signal.SIGSTOP:
            victim.proc.send_signal(signal.SIGCONT)
        for p in procs:
            p.terminate()


def test_failover_between_a_whole_holder_and_a_chain_of_slices(tmp_path):
    """A whole holder and a chain of slices (the coordinator's own layer 0 + a slice node's 1-5)
    both cover the model; whichever the planner picks first loses its remote node to SIGKILL
    mid-stream and the other kind of route carries on: the same greedy text, no repeat."""
    model = whole_model(tmp_path)
    h = start_whole_node(tmp_path, "h", model)
    c = start_slice_node(tmp_path, "c", model, "0-0", bootstrap=[h.peer_port])
    s = start_slice_node(tmp_path, "s", model, "1-5", bootstrap=[c.peer_port])
    procs = [h, c, s]
    try:
        model_id, by_short = _start([h, s], c)
        expected = llama_greedy(model, PROMPT, 60)
        res = run(stream_and_signal(c, model_id, PROMPT, 60,
                                    lambda nodes: by_short[nodes[0]] if len(nodes) == 1 else by_short[nodes[1]],
                                    after=3))
        assert res.outcome == "ok", res.error
        assert res.text == expected
        first_route = {"nodes": res.headers["x-swarm-nodes"].split(","), "victim": res.signalled}
        whole_first = first_route["victim"] is h
        assert len(first_route["nodes"]) == (1 if whole_first else 2)

        def summary():
            found = [ln for ln in c.node_log().splitlines() if "DIAG: request complete" in ln]
            return found[-1] if found else None
        line = run(wait_until(summary, 10, 0.05, "the request's summary line"))
        # the second attempt ran on the other kind of route
        assert "assemblies=2" in line and f"segments={2 if whole_first else 1}" in line and "outcome=ok" in line
        assert "cause=link_drop" in [ln for ln in c.node_log().splitlines() if "pipeline attempt failed" in ln][0]
        run(_idle(c, s if whole_first else h))
    finally:
        for p in procs:
            p.terminate()
