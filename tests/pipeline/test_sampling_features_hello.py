"""A peer whose HELLO lists no sampling features (a version before 2026-12-07) is sent no request
using a field outside the old set.

Such a peer (5607039 and older) ignored a sampling field it lacked, and one in the middle of a chain
re-encoded the dict without it: a request with `min_tokens` answered 200 with a reply breaking it.
A node now lists the features it decodes in its HELLO (`sampling`); the coordinator reads a HELLO
without the list as the old set (sampling.OLD_FEATURES) and leaves such a node out of a request
using a newer one before any work is sent — another holder or chain, else a 503
`sampling_unsupported` naming the field and the node. A plain request still runs on it.

Real nodes in-process on loopback; the older one is a node whose HELLO omits `sampling` (what a
version before 2026-12-07 sends), its GENERATE or WORK frames recorded to show it never got the field.
Review r63: the older node is named only where its update would give a chain (else the real gap and
who failed), the 503 says `x-should-retry: false`, and a wait for a lost holder ends in it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import openai
import pytest

from node import const
from node.hello import HelloParts
from node.inference.pipeline.acks import PendingAck
from node.inference.pipeline.wire import Result, Work
from node.net import FrameType
from tests.pipeline.test_sampling_mixed_versions import COMMON, ask, counting, routed, slower, swarm
from tests.support.nodes import node_config, running_node

pytestmark = [pytest.mark.llama, pytest.mark.slow]

NEW_FIELD = "min_tokens"


def as_older_hello(monkeypatch, *data_dirs: Path) -> None:
    """The nodes of these data dirs send a HELLO without `sampling`, as a version before 2026-12-07."""
    real = HelloParts._hello_sampling
    old = {Path(d) for d in data_dirs}

    def hello_sampling(self):
        return None if Path(self.config.data_dir) in old else real(self)
    monkeypatch.setattr(HelloParts, "_hello_sampling", hello_sampling)


@contextlib.asynccontextmanager
async def older_node_swarm(tmp_path: Path, monkeypatch, caplog):
    """A swarm's client holding layers 0-1 (the pipeline's log kept in `caplog`) and `holder(name, layers)`,
    a node joining it from data dir tmp_path/name; the one named "old" sends the HELLO of a version
    before 2026-12-07."""
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    as_older_hello(monkeypatch, tmp_path / "old")
    async with swarm(tmp_path, "0-1", None) as (c, _holder):
        boot = [f"127.0.0.1:{c.peers.listen_port}"]

        def holder(name: str, layers: str):
            return running_node(node_config(tmp_path / name, *map(Path, c.config.models), bootstrap=boot,
                                            layers=layers, **COMMON))
        yield c, holder


async def refused_before_sending(c, model_id: str, old, seen_old) -> None:
    """A request using NEW_FIELD: 503 sampling_unsupported naming the field and `old`, which got nothing."""
    n = len(seen_old)
    with pytest.raises(openai.APIStatusError) as err:
        await ask(c, model_id, **{NEW_FIELD: 4})
    body = err.value.body if isinstance(err.value.body, dict) else {}
    assert err.value.status_code == 503, (err.value.status_code, body)
    assert body.get("code") == "sampling_unsupported", body
    assert f"'{NEW_FIELD}'" in body["message"] and old.node_id[:8] in body["message"], body
    assert "update" in body["message"] and body.get("param") == NEW_FIELD, body
    # the SDKs retry a 503 twice with backoff unless told not to: the same swarm refuses it the same way
    assert err.value.response.headers.get("x-should-retry") == "false"
    assert len(seen_old) == n  # never sent: a version that ignores the field would have answered 200


async def test_a_whole_holder_listing_no_features_is_not_sent_a_newer_field(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    as_older_hello(monkeypatch, tmp_path / "old")
    async with swarm(tmp_path, "0-0", None) as (c, holder), holder("old") as old:
        seen_old = counting(old, FrameType.GENERATE, old.remote_server.on_generate)
        model_id = await routed(c, old)
        assert c.peers.peer(old.node_id).sampling is None  # its HELLO said nothing
        assert (await ask(c, model_id)).usage.completion_tokens >= 1 and len(seen_old) == 1  # plain: runs there
        await refused_before_sending(c, model_id, old, seen_old)
        assert "left out nodes that cannot sample this request" in caplog.text
        with pytest.raises(openai.APIStatusError) as err:  # a grammar type it lacks: the same
            await ask(c, model_id, grammar='root ::= "a"+')
        assert err.value.status_code == 503 and "grammar type 'gbnf'" in err.value.body["message"], err.value.body
        assert len(seen_old) == 1
        assert "pipeline attempt failed" not in caplog.text and "pipeline node cannot sample" not in caplog.text

        async with holder("new") as new:  # a holder of this version joins: the request runs there only
            slower(monkeypatch, new.node_id)  # (the old one stays the cheaper route for plain requests)
            seen_new = counting(new, FrameType.GENERATE, new.remote_server.on_generate)
            await routed(c, old, new)
            assert c.peers.peer(new.node_id).sampling  # lists what it decodes
            reply = await ask(c, model_id, **{NEW_FIELD: 4})
            assert reply.usage.completion_tokens >= 4
            assert seen_new and seen_new.last().get(NEW_FIELD) == 4
            assert all(NEW_FIELD not in s for s in seen_old.values()) and len(seen_old) == 1
            assert (await ask(c, model_id)).usage.completion_tokens >= 1 and len(seen_old) == 2
            assert "pipeline attempt failed" not in caplog.text


async def test_a_mid_chain_node_listing_no_features_is_routed_around(tmp_path, monkeypatch, caplog):
    """The old node is not the one that samples: it would re-encode the dict without the field."""
    async with older_node_swarm(tmp_path, monkeypatch, caplog) as (c, holder):
        async with holder("old", "2-3") as old, holder("last", "4-5") as last:
            seen_old = counting(old, FrameType.WORK, old.worker.on_work)
            seen_last = counting(last, FrameType.WORK, last.worker.on_work)
            model_id = await routed(c, old, last)
            assert (await ask(c, model_id)).usage.completion_tokens >= 1 and seen_old and seen_last
            await refused_before_sending(c, model_id, old, seen_old)
            assert all(NEW_FIELD not in s for s in seen_last.values())  # the last segment got nothing either
            assert "pipeline attempt failed" not in caplog.text

            async with holder("mid", "2-3") as mid:  # another holder of the old node's layers
                slower(monkeypatch, mid.node_id)
                seen_mid = counting(mid, FrameType.WORK, mid.worker.on_work)
                await routed(c, old, last, mid)
                reply = await ask(c, model_id, **{NEW_FIELD: 4})
                assert reply.usage.completion_tokens >= 4
                assert seen_mid and seen_mid.last().get(NEW_FIELD) == 4
                assert seen_last.last().get(NEW_FIELD) == 4
                assert all(NEW_FIELD not in s for s in seen_old.values())
                assert "pipeline attempt failed" not in caplog.text


def failing(node) -> list[str]:
    """`node` fails every WORK frame it is sent (an error RESULT naming itself); the sessions."""
    failed: list[str] = []

    def fail(header, payload, sender):
        work = Work.from_header(header)
        failed.append(work.sid)
        node.worker.acks.send(PendingAck(work, time.monotonic()))
        result = Result(work.sid, work.seq, telemetry=work.telemetry, error="CUDA error: out of memory",
                        error_code="internal_error", failed_node=node.node_id)
        node.transport.send(work.coordinator, FrameType.RESULT, result.to_header())
    node.transport.on_local(FrameType.WORK, fail)
    node.transport.register_remote(FrameType.WORK)
    return failed


async def test_an_older_node_that_would_not_close_the_gap_is_not_blamed(tmp_path, monkeypatch, caplog):
    """Review r63: with an older node left out, any "no chain" became "node X does not support
    'min_tokens': update it", though X changed nothing: the newer holder of layers 2-5 failed this
    request and nobody else holds 4-5. Now the client reads the real gap and who failed; the older
    node is named only where a chain takes it (there, with who failed too)."""
    async with older_node_swarm(tmp_path, monkeypatch, caplog) as (c, holder):
        async with holder("old", "2-3") as old, holder("bad", "2-5") as bad:
            failed = failing(bad)
            model_id = await routed(c, old, bad)
            with pytest.raises(openai.APIStatusError) as err:
                await ask(c, model_id, **{NEW_FIELD: 4})
            body = err.value.body if isinstance(err.value.body, dict) else {}
            assert err.value.status_code == 503 and failed, (err.value.status_code, body)
            assert body.get("code") == "insufficient_capacity", body  # was sampling_unsupported, "update" old
            assert "no holder has layers 4-5" in body["message"], body
            assert f"left out after failing this request: {bad.node_id[:8]}" in body["message"], body
            assert "CUDA error" in body["message"] and "update" not in body["message"], body

            async with holder("tail", "4-5") as tail:  # now old's update would give a chain: it is named
                await routed(c, old, bad, tail)
                n = len(failed)
                with pytest.raises(openai.APIStatusError) as err:
                    await ask(c, model_id, **{NEW_FIELD: 4})
                body = err.value.body if isinstance(err.value.body, dict) else {}
                assert err.value.status_code == 503 and len(failed) > n, (err.value.status_code, body)
                assert body.get("code") == "sampling_unsupported" and body.get("param") == NEW_FIELD, body
                assert f"node {old.node_id[:8]} does not support the sampling field '{NEW_FIELD}'" in body["message"]
                assert f"left out after failing this request: {bad.node_id[:8]}" in body["message"], body


async def test_a_wait_for_a_lost_holder_ends_in_the_sampling_refusal(tmp_path, monkeypatch, caplog):
    """The newer holder's link drops under the request and only an older node holds its layers: the
    request waits ROUTE_REGAIN_S for it to link again (it may), then is told the field and the older
    node (503 sampling_unsupported, not to be retried), not insufficient_capacity (review r63)."""
    monkeypatch.setattr(const, "ROUTE_REGAIN_S", 2.0)
    async with older_node_swarm(tmp_path, monkeypatch, caplog) as (c, holder):
        async with holder("old", "2-5") as old, holder("new", "2-5") as new:
            model_id = await routed(c, old, new)
            stops: list[asyncio.Task] = []

            def gone(header, payload, sender):  # its links close as the request's first step comes
                if not stops:
                    stops.append(asyncio.get_running_loop().create_task(new.peers.async_stop()))
            new.transport.on_local(FrameType.WORK, gone)
            new.transport.register_remote(FrameType.WORK)
            with pytest.raises(openai.APIStatusError) as err:
                await ask(c, model_id, **{NEW_FIELD: 4})
            body = err.value.body if isinstance(err.value.body, dict) else {}
            assert stops and "pipeline waiting for a lost peer to link again" in caplog.text  # the wait is kept
            assert err.value.status_code == 503, (err.value.status_code, body)
            assert body.get("code") == "sampling_unsupported" and body.get("param") == NEW_FIELD, body
            assert f"node {old.node_id[:8]} does not support the sampling field '{NEW_FIELD}'" in body["message"]
            assert f"waited 2 s for {new.node_id[:8]} to link again" in body["message"], body
            assert err.value.response.headers.get("x-should-retry") == "false"
            # said once, not at each of the wait's plans (5 a second: review r67)
            assert caplog.text.count("left out nodes that cannot sample this request") == 1, caplog.text
