"""A holder's failed whole-model load, in-process (a real ModelManager running llama.cpp, the real
transport, frames to the coordinator captured): a peer's GENERATE or EMBED follows the rule a local
request does (2026-12-06; it was refused `model_unavailable` even after the file changed, so a
fixed file was never loaded for peers): the failure's `model_load_failed` while it stands, a load
once the file changed; a model without a vocabulary is refused `model_load_failed`."""

from __future__ import annotations

import asyncio
import logging
import os

import numpy as np
import pytest

from node.config import NodeConfig
from node.inference.manager import ModelManager
from node.inference.pipeline.embed_serve import RemoteEmbedServer
from node.inference.pipeline.embed_wire import Embedded
from node.inference.pipeline.remote_serve import RemoteGenerateServer
from node.inference.pipeline.remote_wire import Generate, Tokens
from node.inference.pipeline.transport import PipelineTransport
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from node.net import FrameType
from tests.node.test_model_load_failed import loads_failed, without_tensor
from tests.pipeline.workerkit import RecordingPeers
from tests.support.nodes import TINY, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

ME, COORD = "a" * 64, "c" * 64


@pytest.fixture
async def holder(tmp_path):
    good = tiny_model(tmp_path, TINY, "good.gguf")
    files = [without_tensor(good, tmp_path / "broken.gguf", "blk.1.ffn_down.weight"),
             without_tensor(good, tmp_path / "novocab.gguf", "", drop_key="tokenizer.ggml.tokens")]
    catalog = ModelCatalog(None)
    entries = await asyncio.to_thread(catalog.scan, [(f, "cli") for f in files])
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    served = [await models.async_register(e) for e in entries]
    await models.async_load_all()
    assert [s.state for s in served] == ["failed", "failed"]
    peers = RecordingPeers()
    transport = PipelineTransport(ME, peers)
    servers = RemoteGenerateServer(ME, models, transport, None), RemoteEmbedServer(ME, models, transport, None)
    yield servers, served, peers
    for server in servers:
        server.close()
    await models.async_close()


def _codes(peers, ftype) -> dict[str, str]:
    decode = Tokens.from_frame if ftype == FrameType.TOKENS else Embedded.from_frame
    ends = (decode(f.header, f.payload) for f in peers.sent if f.type == ftype and f.header.get("end"))
    return {m.sid: m.error_code for m in ends}


def _generate(server, served, sid: str) -> None:
    gen = Generate(sid, served.entry.sha256, (1, 2, 3), SamplingParams(temperature=0.0), 4, COORD)
    server.on_generate(gen.to_header(), gen.payload(), COORD)


def _embed(server, served, sid: str) -> None:
    ids = np.array([1, 2, 3], dtype="<i4")
    server.on_embed({"sid": sid, "model": served.entry.sha256, "coord": COORD, "lens": [3]}, ids.tobytes(), COORD)


def _touch(path) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.mark.parametrize("kind", ["generate", "embed"])
async def test_a_peers_request_follows_the_local_rule(holder, caplog, kind):
    caplog.set_level(logging.INFO)
    (gen_server, embed_server), (broken, novocab), peers = holder
    server, send, ftype = ((gen_server, _generate, FrameType.TOKENS) if kind == "generate"
                           else (embed_server, _embed, FrameType.EMBEDDED))
    send(server, broken, "s/stands")
    send(server, novocab, "s/novocab")
    await wait_until(lambda: len(_codes(peers, ftype)) == 2, what="both error ends")
    assert _codes(peers, ftype) == {"s/stands": "model_load_failed", "s/novocab": "model_load_failed"}
    assert loads_failed(caplog) == 0 and not broken.waiting
    _touch(broken.entry.path)  # the file changed: this peer's request loads it again, as a local one would
    send(server, broken, "s/changed")
    await wait_until(lambda: "s/changed" in _codes(peers, ftype), what="the changed file's error end")
    assert _codes(peers, ftype)["s/changed"] == "model_load_failed"
    assert loads_failed(caplog) == 1, "a peer's request did not load the changed file"
    await wait_until(lambda: server.in_flight == 0 and not broken.waiting, what="the requests to end")
