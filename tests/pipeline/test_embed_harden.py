"""Remote embeddings in-process, bounded against a peer that asks too much or answers too much:
the holder (a real ModelManager running llama.cpp, the real transport, frames to the asker
captured) never walks a token or a float on its loop, refuses cheaply before reading every id, and
holds one peer to EMBED_REMOTE_MAX_PER_ASKER EMBEDs at once; the asker (the real RemoteEmbedder,
LayerHolders over peer snapshots) leaves out a holder whose vectors have the wrong width or size
and asks the next one. The loop police (tests/conftest.py) fails a loop step over 0.25 s of CPU."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from node import const
from node.config import NodeConfig
from node.errors import ProtocolError
from node.inference.manager import ModelManager
from node.inference.pipeline.deadlines import StepDeadlines
from node.inference.pipeline.embed_remote import RemoteEmbedder
from node.inference.pipeline.embed_serve import RemoteEmbedServer
from node.inference.pipeline.embed_wire import Embed, Embedded
from node.inference.pipeline.holders import LayerHolders
from node.inference.pipeline.perf import PeerPerformance
from node.inference.pipeline.transport import PipelineTransport
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from node.net import FrameType, PeerSnapshot
from node.trace import RequestTrace
from tests.pipeline.test_remote_generate import whole_model
from tests.pipeline.workerkit import RecordingPeers
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

ME, COORD, OTHER = "a" * 64, "c" * 64, "e" * 64
# wide and cheap: 8192-float vectors (as a 70B model's) from one narrow layer
WIDE = SynthSpec(n_layers=1, hidden=8192, n_heads=1, n_kv_heads=1, head_dim=32, ffn=32, vocab=512, n_ctx=512,
                 name="wide1")


async def _holder(tmp_path, model, **config):
    catalog = ModelCatalog(None)
    entry = (await asyncio.to_thread(catalog.scan, [(model, "cli")]))[0]  # hashing the file: off the loop
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1, **config), catalog)
    served = await models.async_register(entry)
    await models.async_load(served.id)
    peers = RecordingPeers()
    return RemoteEmbedServer(ME, models, PipelineTransport(ME, peers), None), models, served, peers


def _frame(sid: str, sha: str, lens: list[int], ids: np.ndarray, coord: str = COORD) -> tuple[dict, bytes]:
    """An EMBED's header and payload as a peer sends them (the ids made here without a loop over them)."""
    return {"sid": sid, "model": sha, "coord": coord, "lens": lens}, ids.astype("<i4").tobytes()


def _small(sid: str, sha: str, inputs: list[list[int]], coord: str = COORD) -> tuple[dict, bytes]:
    return _frame(sid, sha, [len(i) for i in inputs], np.array([t for i in inputs for t in i]), coord)


def _ends(peers) -> dict[str, Embedded]:
    return {m.sid: m for m in (Embedded.from_frame(f.header, f.payload) for f in peers.sent
                               if f.type == FrameType.EMBEDDED and f.header.get("end"))}


async def test_a_wide_reply_is_made_float32_off_the_loop(tmp_path):
    """2048 inputs x 8192 floats (the most one reply may carry): made into float32 bytes on the
    loop, those 16M Python floats took ~0.5 s of it."""
    server, models, served, peers = await _holder(tmp_path, await asyncio.to_thread(write_gguf, tmp_path / "wide1.gguf", WIDE))
    try:
        server.on_embed(*_frame("s/wide", served.entry.sha256, [1] * 2048, 1 + np.arange(2048) % 500), COORD)
        await wait_until(lambda: "s/wide" in _ends(peers), 300, 0.05, "the wide reply")
        end = _ends(peers)["s/wide"]
        assert end.end == "ok", end
        assert end.vectors.shape == (2048, 8192) and end.vectors.dtype == np.dtype("<f4")
        assert np.allclose(np.linalg.norm(end.vectors, axis=1), 1.0, atol=1e-4)
    finally:
        server.close()
        await models.async_close()


async def test_refusals_cost_the_loop_nothing_and_ids_are_checked_vectorised(tmp_path):
    """A full queue refuses 1M-token EMBEDs before reading their ids (each cost ~0.06 s of loop when
    every id became a Python int first): sixteen (64 MiB) in one read are one loop step. The vocabulary check
    still names the input holding a bad id."""
    server, models, served, peers = await _holder(tmp_path, await asyncio.to_thread(whole_model, tmp_path), max_queue_per_model=0)
    try:
        sha = served.entry.sha256
        header, payload = _frame("x", sha, [512] * 2048, np.full(const.EMBED_REMOTE_MAX_TOKENS, 7))
        for n in range(16):  # one loop step, as frames arriving in one read are
            server.on_embed({**header, "sid": f"big/{n}"}, payload, COORD)
        ends = _ends(peers)
        assert [ends[f"big/{n}"].error_code for n in range(16)] == ["overloaded"] * 16, ends
        assert server.in_flight == 0 and served.waiting == 0
    finally:
        server.close()
        await models.async_close()
    server, models, served, peers = await _holder(tmp_path, await asyncio.to_thread(whole_model, tmp_path))
    try:
        server.on_embed(*_small("s/vocab", served.entry.sha256, [[1, 2], [3, 4, 512], [5]]), COORD)
        end = _ends(peers)["s/vocab"]
        assert end.error_code == "invalid_request" and "`input[1]`" in end.error and "512" in end.error, end
    finally:
        server.close()
        await models.async_close()


async def test_one_peer_has_at_most_its_share_of_embeds_on_a_holder(tmp_path):
    """EMBEDs from one asker queued behind a busy model: past EMBED_REMOTE_MAX_PER_ASKER they are
    refused `overloaded` (each held its ids and would hold its reply); another peer's still queue,
    and the queued ones all finish once the model is free."""
    server, models, served, peers = await _holder(tmp_path, await asyncio.to_thread(whole_model, tmp_path))
    sha = served.entry.sha256
    await served.lock.acquire()  # the model is busy: EMBEDs queue
    try:
        limit = const.EMBED_REMOTE_MAX_PER_ASKER
        for n in range(limit + 1):
            server.on_embed(*_small(f"q/{n}", sha, [[1, 2, 3]]), COORD)
        server.on_embed(*_small("o/1", sha, [[1, 2, 3]], OTHER), OTHER)
        ends = _ends(peers)
        assert list(ends) == [f"q/{limit}"] and ends[f"q/{limit}"].error_code == "overloaded", ends
        assert server.in_flight == limit + 1
    finally:
        served.lock.release()
    try:
        await wait_until(lambda: len(_ends(peers)) == limit + 2, 60, 0.05, "the queued EMBEDs to finish")
        ends = _ends(peers)
        assert all(ends[f"q/{n}"].end == "ok" for n in range(limit)) and ends["o/1"].end == "ok", ends
        await wait_until(lambda: server.in_flight == 0, 10, 0.02, "the jobs to end")
    finally:
        server.close()
        await models.async_close()


# --- the asking side -----------------------------------------------------------------------------


class _Peers(RecordingPeers):
    """Peer snapshots advertising the model whole on each holder, and recorded links to them."""

    def __init__(self, sha, holders, n_layers=6):
        super().__init__()
        self.snaps = [PeerSnapshot(h, h[:8], "connected", "direct", "127.0.0.1:1", 2.0, 200.0,
                                   ({"sha256": sha, "name": "m", "n_layers": n_layers, "whole": True},), None)
                      for h in holders]

    def peers(self):
        return self.snaps

    def peer(self, node_id):
        return next((s for s in self.snaps if s.node_id == node_id), None)


async def test_a_holder_answering_vectors_of_the_wrong_width_or_size_is_left_out(tmp_path, caplog):
    """Holders answering 3 vectors of width+1 floats, or 17 x 2^20 floats (68 MiB, ~1 s and ~600 MB
    as Python floats), are protocol failures: the next holder's vectors are the answer."""
    catalog = ModelCatalog(None)
    entry = (await asyncio.to_thread(catalog.scan, [(await asyncio.to_thread(whole_model, tmp_path), "cli")]))[0]
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    served = await models.async_register(entry)  # a model this node does not load: the swarm's
    width = entry.header.arch_get("embedding_length")
    holders = ["1" * 64, "2" * 64, "3" * 64]
    peers = _Peers(entry.sha256, holders)
    transport = PipelineTransport(ME, peers)
    perf = PeerPerformance(ME)
    host = SimpleNamespace(for_model=lambda sha: [], adverts=lambda: [])  # no slices here
    asker = RemoteEmbedder(ME, transport, peers, LayerHolders(ME, host, peers, transport, perf),
                           StepDeadlines(ME, None, perf))
    good = np.random.default_rng(0).standard_normal((3, width)).astype("<f4")
    answers = [(np.zeros((3, width + 1), "<f4"), "floats"), (np.zeros((17, 1 << 20), "<f4"), "bytes"), (good, None)]
    asked: list[str] = []
    try:
        task = asyncio.create_task(asker.async_embed(served, [[1, 2], [3], [4, 5, 6]], None, RequestTrace(model=served.id, operation="embeddings")))
        for vectors, _why in answers:
            await wait_until(lambda: sum(f.type == FrameType.EMBED for f in peers.sent) > len(asked), 10, 0.01,
                             "the next EMBED")
            sent = [f for f in peers.sent if f.type == FrameType.EMBED][-1]
            sid = sent.header["sid"]
            holder = next(h for h, _q in [asker.waiting[sid]])
            asked.append(holder)
            reply = Embedded(sid, "ok", vectors)
            asker.on_embedded(reply.to_header(), reply.payload(), holder)
        got = await asyncio.wait_for(task, 10)
    finally:
        await models.async_close()
    assert sorted(asked) == holders  # each asked once: the two bad ones were left out
    failed = [r.getMessage() for r in caplog.records if "remote embeddings attempt failed" in r.getMessage()]
    assert len(failed) == 2 and all("cause=protocol" in m for m in failed), failed
    assert f"node={asked[0][:8]}" in failed[0] and "floats" in failed[0] and "bytes" in failed[1], failed
    assert np.array_equal(np.asarray(got), good)


# widest: 16384-float vectors (as a 405B model's): 2048 of them are 128 MiB, two replies' worth
WIDEST = SynthSpec(n_layers=1, hidden=16384, n_heads=1, n_kv_heads=1, head_dim=32, ffn=32, vocab=259, n_ctx=512,
                   name="widest1")


@pytest.mark.parametrize("shape", ["tokens", "reply"])
async def test_inputs_past_one_embeds_bounds_are_sent_in_parts(tmp_path, shape):
    """2048 inputs of 513 tokens (over EMBED_REMOTE_MAX_TOKENS), or 2048 vectors of 16384 floats
    (over EMBED_REMOTE_MAX_REPLY_BYTES): a client's valid request, which every holder refused
    (`malformed_embed` / `reply_too_large`), a 503. Holders here decode each EMBED as a real one
    does; the vectors come back whole and in order."""
    model = await asyncio.to_thread(whole_model, tmp_path) if shape == "tokens" else \
        await asyncio.to_thread(write_gguf, tmp_path / "widest1.gguf", WIDEST)
    catalog = ModelCatalog(None)
    entry = (await asyncio.to_thread(catalog.scan, [(model, "cli")]))[0]
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    served = await models.async_register(entry)
    width = entry.header.arch_get("embedding_length")
    peers = _Peers(entry.sha256, ["1" * 64, "2" * 64], entry.n_layers)
    transport = PipelineTransport(ME, peers)
    perf = PeerPerformance(ME)
    host = SimpleNamespace(for_model=lambda sha: [], adverts=lambda: [])
    asker = RemoteEmbedder(ME, transport, peers, LayerHolders(ME, host, peers, transport, perf),
                           StepDeadlines(ME, None, perf))
    per_input = 513 if shape == "tokens" else 1
    inputs = [[i % 256] + [7] * (per_input - 1) for i in range(2048)]
    answered, refused = 0, []
    try:
        task = asyncio.create_task(asker.async_embed(served, inputs, None, RequestTrace(model=served.id,
                                                                                        operation="embeddings")))
        while not task.done():
            await wait_until(lambda n=answered: task.done() or sum(f.type == FrameType.EMBED for f in peers.sent) > n,
                             30, 0.01, "the next EMBED")
            for frame in [f for f in peers.sent if f.type == FrameType.EMBED][answered:]:
                answered += 1
                sid, holder = frame.header["sid"], asker.waiting[frame.header["sid"]][0]
                try:  # as the holder decodes and bounds it
                    req = Embed.from_frame(frame.header, frame.payload)
                    if req.n_inputs * width * 4 > const.EMBED_REMOTE_MAX_REPLY_BYTES:
                        raise ProtocolError("reply_too_large")
                except ProtocolError as exc:
                    refused.append(exc.message)
                    code = "reply_too_large" if exc.message == "reply_too_large" else "malformed_embed"
                    reply = Embedded(sid, "error", error_code=code, error=exc.message)
                else:
                    vectors = np.zeros((req.n_inputs, width), "<f4")
                    vectors[:, 0] = req.ids[np.cumsum((0, *req.lens[:-1]))]  # each input's first id
                    reply = Embedded(sid, "ok", vectors)
                # the vectors' own bytes, not a 64 MiB copy made on this loop (the test's, not the asker's, cost)
                payload = memoryview(vectors.reshape(-1).view(np.uint8)) if reply.vectors is not None else b""
                asker.on_embedded(reply.to_header(), payload, holder)
        got = await task
    finally:
        await models.async_close()
    assert not refused and answered == 2, (answered, refused)
    assert got.shape == (2048, width) and np.array_equal(got[:, 0], np.arange(2048) % 256)
