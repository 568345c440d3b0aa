"""A swarm of mixed versions and a request using a sampling field an older peer lacks.

Until 2026-12-07 the peer that samples ignored a key of the sampling dict it did not know: a
request with `min_tokens` (or a "gbnf" grammar, `ignore_eos`) run by a holder of a version before
that field answered 200 with a reply breaking the constraint. Now that peer refuses it
(`sampling_unsupported`, naming the field); the coordinator leaves it out of that request without
charging it (no failed attempt counted, still linked, still used for plain requests) and tries
another holder or chain, else answers 503 `sampling_unsupported` naming the field and the node.
A plain request's sampling leaves out the fields at their defaults, so it still runs there.

Real nodes in-process on loopback; the older peer is one whose decoding knows no `min_tokens`
(the module's WIRE_FIELDS without it, while its own GENERATE or WORK handler runs)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time

import openai
import pytest

from node import const
from node.inference import sampling
from node.inference.pipeline import holders as holders_mod
from node.inference.pipeline.acks import PendingAck
from node.inference.pipeline.wire import Result, Work
from node.inference.sampling import WIRE_REQUIRED
from node.net import FrameType
from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, openai_client, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

COMMON = dict(slice_dtype="f32", slice_kv_dtype="f32", activation_bits=32)
MISSING = "min_tokens"


class Seen(dict):
    """session id -> the sampling dict of its first frame carrying one (a chain sends it each step)."""

    def record(self, header: dict) -> None:
        if header.get("sampling") is not None:
            self.setdefault(header.get("sid"), dict(header["sampling"]))

    def last(self) -> dict:
        return list(self.values())[-1]


def as_older(node, frame_type: FrameType, handler) -> Seen:
    """Make `node` decode its `frame_type` frames as a version without MISSING; the sampling dicts
    it was sent, by session."""
    seen = Seen()

    def older(header, payload, sender):
        seen.record(header)
        known = sampling.WIRE_FIELDS
        sampling.WIRE_FIELDS = known - {MISSING}
        try:
            handler(header, payload, sender)
        finally:
            sampling.WIRE_FIELDS = known
    node.transport.on_local(frame_type, older)
    node.transport.register_remote(frame_type)  # (peers' frames: the handler is taken at registration)
    return seen


def counting(node, frame_type: FrameType, handler) -> Seen:
    seen = Seen()

    def count(header, payload, sender):
        seen.record(header)
        handler(header, payload, sender)
    node.transport.on_local(frame_type, count)
    node.transport.register_remote(frame_type)
    return seen


def slower(monkeypatch, node_id: str) -> None:
    """Plan `node_id` as a slow holder: the older one is the cheaper route, asked first."""
    real = holders_mod._holder

    def planned(snap, m, measured):
        h = real(snap, m, measured)
        return dataclasses.replace(h, ms_per_layer=1000.0) if h is not None and snap.node_id == node_id else h
    monkeypatch.setattr(holders_mod, "_holder", planned)


async def routed(c, *holders) -> str:
    """c links every holder and lists the model; its id."""
    async def ready():
        if any(c.peers.link(h.node_id) is None for h in holders):
            return None
        listed = await openai_client(c).models.list()
        ids = [m.id for m in listed.data if (m.model_extra or {}).get("name") == "split6"]
        return ids[0] if ids else None
    return await wait_until(ready, 60, 0.1, "c linked to its holders, routing split6")


@contextlib.asynccontextmanager
async def swarm(tmp_path, c_layers: str, holder_layers: str | None):
    model = split_model(tmp_path)
    async with running_node(node_config(tmp_path / "c", model, layers=c_layers, **COMMON)) as c:
        boot = [f"127.0.0.1:{c.peers.listen_port}"]

        def holder(name: str):
            extra = {"layers": holder_layers} if holder_layers else {}
            return running_node(node_config(tmp_path / name, model, bootstrap=boot, **COMMON, **extra))
        yield c, holder


async def ask(c, model_id: str, **extra):
    return await openai_client(c).chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "count"}], max_tokens=6, temperature=0,
        extra_body=extra or None)


async def check_mixed(c, holder, old, frame_type, handler, monkeypatch, caplog):
    seen_old = as_older(old, frame_type, handler(old))
    model_id = await routed(c, old)
    plain = await ask(c, model_id)  # defaults left out: the older peer runs it
    assert plain.usage.completion_tokens >= 1
    assert seen_old and set(seen_old.last()) == WIRE_REQUIRED | {"max_tokens"}, seen_old

    with pytest.raises(openai.APIStatusError) as err:
        await ask(c, model_id, min_tokens=4)
    body = err.value.body if isinstance(err.value.body, dict) else {}
    assert err.value.status_code == 503, (err.value.status_code, body)
    assert body.get("code") == "sampling_unsupported", body
    assert "'min_tokens'" in body["message"] and old.node_id[:8] in body["message"], body
    assert "update" in body["message"], body
    assert seen_old.last().get(MISSING) == 4
    # not charged: no failed attempt, still linked, and the next plain request still runs on it
    assert "pipeline attempt failed" not in caplog.text
    assert "cannot sample this request" in caplog.text
    assert c.peers.link(old.node_id) is not None
    n = len(seen_old)
    assert (await ask(c, model_id)).usage.completion_tokens >= 1 and len(seen_old) == n + 1

    async with holder("new") as new:  # a holder of this version joins: the request runs there
        slower(monkeypatch, new.node_id)
        seen_new = counting(new, frame_type, handler(new))
        await routed(c, old, new)
        reply = await ask(c, model_id, min_tokens=4)
        assert reply.usage.completion_tokens >= 4
        assert seen_old.last().get(MISSING) == 4 and len(seen_old) == n + 2  # asked first, refused
        assert seen_new and seen_new.last().get(MISSING) == 4
        assert "pipeline attempt failed" not in caplog.text


async def test_a_whole_holder_lacking_a_field_refuses_it_and_another_serves(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    # c holds one layer (its tokenizer): the whole holders are its only routes
    async with swarm(tmp_path, "0-0", None) as (c, holder), holder("old") as old:
        await check_mixed(c, holder, old, FrameType.GENERATE, lambda n: n.remote_server.on_generate,
                          monkeypatch, caplog)


async def test_a_last_segment_lacking_a_field_refuses_it_and_another_serves(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    async with swarm(tmp_path, "0-2", "3-5") as (c, holder), holder("old") as old:
        await check_mixed(c, holder, old, FrameType.WORK, lambda n: n.worker.on_work, monkeypatch, caplog)


async def test_a_refusal_naming_another_node_is_counted_and_the_request_ends(tmp_path, caplog):
    """Review r60: the last segment answering every sampling step `sampling_unsupported` with a made-up
    node as the failed one. Uncounted and leaving out no node of the route, the request was planned
    again on the same chain for ever (4700 attempts in 20 s); now only the sampling node's own refusal
    is left uncounted, and this one fails over as any failure, bounded by MAX_ASSEMBLIES."""
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    async with swarm(tmp_path, "0-2", "3-5") as (c, holder), holder("bad") as bad:
        real, refusals = bad.worker.on_work, []

        def refuse(header, payload, sender):
            work = Work.from_header(header)
            if not work.sample:
                return real(header, payload, sender)
            refusals.append(work.sid)
            bad.worker.acks.send(PendingAck(work, time.monotonic()))
            result = Result(work.sid, work.seq, telemetry=work.telemetry, error="does not support x",
                            error_code="sampling_unsupported", failed_node=os.urandom(32).hex())
            bad.transport.send(work.coordinator, FrameType.RESULT, result.to_header())
        bad.transport.on_local(FrameType.WORK, refuse)
        bad.transport.register_remote(FrameType.WORK)
        model_id = await routed(c, bad)
        with pytest.raises(openai.APIStatusError) as err:
            await asyncio.wait_for(ask(c, model_id), 60)
        assert err.value.status_code == 503
        assert len(refusals) <= const.MAX_ASSEMBLIES, refusals
        assert "cannot sample this request" not in caplog.text
