"""Finish reasons and the stop-reason lines of seed 000, on a real node whose engine is scripted.

The tokenizer, text assembly, trace and API are real; only the token ids the model "samples" are
chosen by the test (random weights rarely emit EOS), so each case is exact.
"""

from __future__ import annotations

import logging

import openai
import pytest
import pytest_asyncio

from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.sse import DONE, sse_data

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

EOS = 2


def byte_token(ch: str) -> int:
    """Id of the byte-fallback token for an ASCII character in the synth vocabulary."""
    return 3 + ord(ch)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("finish")
    async with running_node(node_config(base / "data", tiny_model(base))) as n:
        yield n


@pytest.fixture
def script(node, monkeypatch):
    """Make the model emit the given token ids (then stop as the real engine would)."""
    served = node.models.all()[0]

    def set_tokens(tokens):
        def generate(job, channel, is_eog, vocab=None):
            produced = 0
            for tok in tokens:
                if job.cancel.is_set():
                    break
                channel.put(tok)
                produced += 1
                if is_eog(tok) or produced >= job.max_new_tokens:
                    break
            channel.close()
        monkeypatch.setattr(served.engine, "submit",  # in place of the batch: this script, on the engine's thread
                            lambda *args: served.engine.executor.submit(generate, *args))
    return set_tokens


@pytest.fixture
def client(node):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)


async def ask(client, **kw):
    return await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], **kw)


async def test_model_ends_turn_immediately(client, script, caplog, node):
    script([EOS])
    with caplog.at_level(logging.INFO):
        reply = await ask(client, max_tokens=20)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == ""
    assert reply.usage.completion_tokens == 0
    assert "ended its turn immediately" in caplog.text
    assert node.traces.recent[-1].finish_detail == "eos"


async def test_eos_after_text_is_a_normal_stop(client, script, caplog):
    script([byte_token(c) for c in "hello"] + [EOS])
    with caplog.at_level(logging.INFO):
        reply = await ask(client, max_tokens=20)
    assert reply.choices[0].message.content == "hello"
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == 5
    assert "ended its turn immediately" not in caplog.text
    assert "stop sequence in the request matched" not in caplog.text


async def test_stop_sequence_matched_at_once_names_culprit(client, script, caplog, node):
    script([byte_token(c) for c in "##rest of answer"])
    with caplog.at_level(logging.INFO):
        reply = await ask(client, max_tokens=20, stop=["##"])
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == ""
    assert "stop sequence in the request matched" in caplog.text and "'##'" in caplog.text
    assert node.traces.recent[-1].finish_detail == "stop_sequence"


async def test_stop_sequence_later_is_silent(client, script, caplog):
    script([byte_token(c) for c in "a long answer. END and more"])
    with caplog.at_level(logging.INFO):
        reply = await ask(client, max_tokens=40, stop=["END"])
    assert reply.choices[0].message.content == "a long answer. "
    assert reply.choices[0].finish_reason == "stop"
    assert "stop sequence in the request matched" not in caplog.text


async def test_stop_sequence_split_across_stream_chunks(client, script):
    script([byte_token(c) for c in "abcXYZdef"])
    stream = await ask(client, max_tokens=40, stop=["XYZ"], stream=True)
    chunks = [c async for c in stream]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == "abc"
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["stop"]


async def test_max_tokens_one_is_silent(client, script, caplog):
    script([byte_token("x")] * 5)
    with caplog.at_level(logging.INFO):
        reply = await ask(client, max_tokens=1)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 1
    for phrase in ("ended its turn immediately", "stop sequence in the request matched", "empty after finalisation"):
        assert phrase not in caplog.text


async def test_empty_after_finalisation(client, script, caplog):
    script([1, 1, 1, EOS])  # BOS is a control token: it adds no text
    with caplog.at_level(logging.INFO):
        reply = await ask(client, max_tokens=20)
    assert reply.choices[0].message.content == ""
    assert "empty after finalisation" in caplog.text


async def test_utf8_reply_survives_byte_tokens(client, script):
    data = "café 🚀".encode()
    script([3 + b for b in data] + [EOS])
    stream = await ask(client, max_tokens=40, stream=True)
    text = "".join([ch.delta.content or "" async for c in stream for ch in c.choices])
    assert text == "café 🚀"


async def test_unexpected_error_mid_stream_ends_the_stream_with_an_error_event(client, script, node, monkeypatch):
    import aiohttp

    script([byte_token(c) for c in "abcdef"] + [EOS])
    served = node.models.all()[0]
    real_piece = served.tokenizer.piece
    calls = {"n": 0}

    def flaky_piece(token):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("a bug in text assembly")
        return real_piece(token)

    monkeypatch.setattr(served.tokenizer, "piece", flaky_piece)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s, s.post(
            f"http://127.0.0.1:{node.api.port}/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        raw = await r.text()  # returns: the stream ends instead of hanging
    events = sse_data(raw)
    assert events[-1] == DONE
    import json

    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error" and "internal error" in err["message"]
    trace = node.traces.recent[-1]
    assert trace.outcome == "error" and trace.error_type == "NodeError"
