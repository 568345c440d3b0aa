"""The remote-generate holder in-process: a real ModelManager running llama.cpp, the real transport,
frames to the coordinator captured. Streams in order, refusals with their codes, keepalives while
queued, a cancel while queued releases everything."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from node import const
from node.config import NodeConfig
from node.inference.manager import ModelManager
from node.inference.pipeline.remote_serve import RemoteGenerateServer
from node.inference.pipeline.remote_wire import MAX_PROMPT_TOKENS, Generate, GenerateCancel, Tokens
from node.inference.pipeline.transport import PipelineTransport
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from node.net import FrameType
from tests.pipeline.swarm import split_model
from tests.pipeline.workerkit import RecordingPeers
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

ME, COORD = "a" * 64, "c" * 64


@pytest.fixture
async def holder(tmp_path):
    catalog = ModelCatalog(None)
    entry = catalog.scan([(split_model(tmp_path), "cli")])[0]
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    served = await models.async_register(entry)
    await models.async_load(served.id)
    peers = RecordingPeers()
    contributing = [True]
    server = RemoteGenerateServer(ME, models, PipelineTransport(ME, peers), None, contributing=lambda: contributing[0])
    yield server, served, peers, contributing
    server.close()
    await models.async_close()


def _gen(served, sid="s/1", prompt=(1, 2, 3), max_new=12) -> Generate:
    return Generate(sid, served.entry.sha256, tuple(prompt), SamplingParams(temperature=0.0), max_new, COORD)


def _tokens(peers, sid) -> list[Tokens]:
    return [Tokens.from_frame(f.header, f.payload) for f in peers.sent
            if f.type == FrameType.TOKENS and f.header.get("sid") == sid]


async def test_a_generation_streams_numbered_batches_then_its_end(holder):
    server, served, peers, _ = holder
    gen = _gen(served)
    server.on_generate(gen.to_header(), gen.payload(), COORD)
    assert server.in_flight == 1
    await wait_until(lambda: any(t.end for t in _tokens(peers, gen.sid)), 30, 0.02, "the end frame")
    frames = _tokens(peers, gen.sid)
    tokens = [t for f in frames for t in f.tokens]
    assert frames[-1].end in ("eog", "length") and 0 < len(tokens) <= 12
    sent = 0
    for f in frames:  # numbered without a gap or a repeat
        assert f.first == sent
        sent += len(f.tokens)
    await wait_until(lambda: server.in_flight == 0, 10, 0.02, "the generation to finish")
    assert not served.lock.locked() and not served.busy and served.waiting == 0
    assert served.engine.ms_per_token is not None  # the holder's own decode rate, for its advert


async def test_refusals_carry_their_codes(holder):
    server, served, peers, contributing = holder
    bad_ctx = _gen(served, "s/ctx", prompt=[5] * served.n_ctx)
    server.on_generate(bad_ctx.to_header(), bad_ctx.payload(), COORD)
    other = _gen(served, "s/other")
    server.on_generate(other.to_header(), other.payload(), "e" * 64)  # from a node it does not name
    contributing[0] = False
    paused = _gen(served, "s/paused")
    server.on_generate(paused.to_header(), paused.payload(), COORD)
    contributing[0] = True
    first, dup = _gen(served, "s/dup", max_new=200), _gen(served, "s/dup")
    server.on_generate(first.to_header(), first.payload(), COORD)
    server.on_generate(dup.to_header(), dup.payload(), COORD)
    codes = {f.header["sid"]: f.header["error"]["code"] for f in peers.sent
             if f.type == FrameType.TOKENS and f.header.get("end") == "error"}
    assert codes == {"s/ctx": "context_exceeded", "s/other": "coordinator_mismatch", "s/paused": "not_contributing",
                     "s/dup": "duplicate_session"}
    await wait_until(lambda: server.in_flight == 0, 30, 0.02, "the one accepted generation to finish")


async def _hold_every_slot(served) -> None:
    for _ in range(served.lock.limit):
        await served.lock.acquire()
    assert served.lock.locked()


def _release_every_slot(served) -> None:
    for _ in range(served.lock.limit):
        served.lock.release()


async def test_queued_behind_the_lock_it_sends_keepalives_and_a_cancel_frees_it(holder, monkeypatch):
    server, served, peers, _ = holder
    monkeypatch.setattr(const, "GENERATE_KEEPALIVE_S", 0.05)
    await _hold_every_slot(served)  # local requests hold the model
    try:
        gen = _gen(served, "s/queued")
        server.on_generate(gen.to_header(), gen.payload(), COORD)
        await wait_until(lambda: len(_tokens(peers, gen.sid)) >= 2, 10, 0.02, "keepalives while queued")
        assert all(not t.tokens and t.end is None and t.first == 0 for t in _tokens(peers, gen.sid))
        assert served.waiting == 1
        server.on_cancel(GenerateCancel(gen.sid).to_header(), b"", COORD)
        await wait_until(lambda: server.in_flight == 0, 10, 0.02, "the queued generation to go")
        assert served.waiting == 0
        before = len(_tokens(peers, gen.sid))
    finally:
        _release_every_slot(served)
    # nothing more is sent for a cancelled generation, and the model serves the next one
    nxt = _gen(served, "s/next", max_new=2)
    server.on_generate(nxt.to_header(), nxt.payload(), COORD)
    await wait_until(lambda: any(t.end for t in _tokens(peers, nxt.sid)), 30, 0.02, "the next generation")
    assert len(_tokens(peers, gen.sid)) == before


async def test_a_huge_prompt_is_refused_by_its_length_before_a_token_is_decoded(holder):
    """A GENERATE of MAX_PROMPT_TOKENS ids (64 MiB) is refused `context_exceeded` on the loop thread
    without a Python object per token (conftest fails a loop step of ≥0.25 s CPU); an id outside the
    vocabulary is refused `malformed_generate`."""
    server, served, peers, _ = holder
    header = _gen(served, "s/huge").to_header()
    header["n"] = MAX_PROMPT_TOKENS
    server.on_generate(header, bytes(4 * MAX_PROMPT_TOKENS), COORD)
    oov = _gen(served, "s/oov", prompt=(1, served.tokenizer.n_vocab, 2))
    server.on_generate(oov.to_header(), oov.payload(), COORD)
    codes = {f.header["sid"]: f.header["error"]["code"] for f in peers.sent
             if f.type == FrameType.TOKENS and f.header.get("end") == "error"}
    assert codes == {"s/huge": "context_exceeded", "s/oov": "malformed_generate"}
    assert server.in_flight == 0 and served.waiting == 0


async def test_a_burst_of_generates_in_one_turn_is_held_to_the_queue_cap(holder):
    """GENERATEs delivered in one read of the link (no loop turn between them) are each counted as
    queued when admitted: the model's queue cap holds, the rest are refused `overloaded`."""
    server, served, peers, _ = holder
    cap = server.models.config.max_queue_per_model
    await _hold_every_slot(served)  # local requests hold the model: every accepted one queues
    try:
        for i in range(cap + 3):
            gen = _gen(served, f"s/burst{i}")
            server.on_generate(gen.to_header(), gen.payload(), COORD)
        overloaded = {f.header["sid"] for f in peers.sent if f.type == FrameType.TOKENS
                      and f.header.get("end") == "error" and f.header["error"]["code"] == "overloaded"}
        assert overloaded == {f"s/burst{i}" for i in range(cap, cap + 3)}
        assert server.in_flight == cap and served.waiting == cap
        server.close()  # every one still queued goes, each counted out once
        await wait_until(lambda: server.in_flight == 0, 10, 0.02, "the queued generations to go")
        assert served.waiting == 0
    finally:
        _release_every_slot(served)


@pytest.mark.parametrize("how", ["cancel", "link_drop", "close"])
async def test_a_generation_stopped_before_its_task_starts_is_removed(holder, how):
    """GENERATE then GENERATE_CANCEL (or the coordinator's link dropping, or close()) in the same loop
    turn: the task is cancelled before its first step, and the generation is still counted out; the
    same session id is accepted again and runs."""
    server, served, peers, _ = holder
    gen = _gen(served, "s/early", max_new=2)
    server.on_generate(gen.to_header(), gen.payload(), COORD)
    if how == "cancel":
        server.on_cancel(GenerateCancel(gen.sid).to_header(), b"", COORD)
    elif how == "link_drop":
        server._on_peer_event("changed", SimpleNamespace(node_id=COORD, state="disconnected"))
    else:
        server.close()
    await wait_until(lambda: server.in_flight == 0, 10, 0.02, "the stopped generation to be removed")
    assert served.waiting == 0 and not served.lock.locked() and not served.busy
    assert server.served == 1 and not _tokens(peers, gen.sid)  # nobody listened: nothing was sent
    server.on_generate(gen.to_header(), gen.payload(), COORD)
    await wait_until(lambda: any(t.end for t in _tokens(peers, gen.sid)), 30, 0.02, "the same sid again")
    assert _tokens(peers, gen.sid)[-1].end in ("eog", "length")
    await wait_until(lambda: server.in_flight == 0, 10, 0.02, "the second run to finish")
    assert served.waiting == 0


def test_a_generate_for_a_model_whose_file_was_cut_is_refused_not_a_crash(tmp_path):
    """A local request for a model whose file was cut while loaded is refused (0bb9efe); a peer's
    GENERATE went on and read the mapped file past its new end: the holder died of SIGBUS. In a
    subprocess (remote_cut_probe.py), so a regression fails this test, not the test run."""
    import json
    import subprocess
    import sys

    from tests.support.processes import REPO, hermetic_env

    done = subprocess.run([sys.executable, "-m", "tests.pipeline.remote_cut_probe", str(tmp_path)], cwd=REPO,
                          env=hermetic_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    end = json.loads(done.stdout.strip().splitlines()[-1])
    assert end["end"] == "error" and end["error_code"] == "model_unavailable", end
    assert "changed on disk while it was loaded" in end["error"]
