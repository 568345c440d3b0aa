"""The Anthropic Messages and OpenAI Responses APIs on the distributed route: a random-weight model
split over two real nodes on 127.0.0.1, driven by the official SDKs. Greedy text equals llama.cpp's
on the whole file, streamed or not; the route shows in the headers and the trace. Today's API
features (fill-in-the-middle, llama-server's native endpoints, t_max_predict_ms, Anthropic documents
and search results, Responses' reasoning/include) answer over the split what a node holding the
same file whole answers (and llama-server's endpoints do on a node holding nothing of it): same text,
usage, finish reasons and stop types, streamed or not."""

from __future__ import annotations

import dataclasses
import json
import re

import aiohttp
import anthropic
import openai
import pytest

from node.inference.synth import write_gguf
from tests.pipeline.swarm import (
    SPLIT,
    llama_greedy,
    run,
    start_coordinator,
    start_slice_node,
    start_whole_node,
    wait_for_route,
    wait_peers,
)
from tests.support.sse import sse_data

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "tell me about the swarm"
N = 12


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("dialects2")
    model = base / "split6-fim.gguf"  # the split model with fill-in-the-middle tokens
    write_gguf(model, dataclasses.replace(SPLIT, fim=True))
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    whole = start_whole_node(base, "w", model)  # on its own: the local route's answers, to compare
    d = start_coordinator(base, a, name="d")  # holds nothing: knows the model from the swarm only
    try:
        async def ready():
            for p in (a, b, whole):
                await p.async_wait_ready()
            await wait_peers(a, 1)
            await wait_peers(d, 2)
            model_id = await wait_for_route(a, "split6-fim")
            assert await wait_for_route(whole, "split6-fim") == model_id
            assert await wait_for_route(d, "split6-fim") == model_id
            return model_id
        model_id = run(ready())
        yield {"model": model, "model_id": model_id, "a": a, "d": d, "whole": whole,
               "expected": llama_greedy(model, PROMPT, N)}
    finally:
        for p in (a, b, whole, d):
            p.terminate()


def test_messages_distributed(swarm):
    a, model_id, expected = swarm["a"], swarm["model_id"], swarm["expected"]
    client = anthropic.Anthropic(base_url=a.base, api_key=a.api_key, max_retries=0, timeout=120)
    raw = client.messages.with_raw_response.create(model=model_id, max_tokens=N, messages=[{"role": "user", "content": PROMPT}],
                                                   extra_body={"temperature": 0})
    msg = raw.parse()
    assert raw.headers["x-swarm-route"] == "distributed" and raw.headers["x-swarm-segments"] == "2"
    text = "".join(b.text for b in msg.content)
    assert text == expected
    assert msg.stop_reason == ("max_tokens" if msg.usage.output_tokens == N else "end_turn")
    with client.messages.stream(model=model_id, max_tokens=N, messages=[{"role": "user", "content": PROMPT}],
                                extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == expected and final.usage.output_tokens == msg.usage.output_tokens
    assert final.stop_reason == msg.stop_reason


def test_responses_distributed(swarm):
    a, model_id, expected = swarm["a"], swarm["model_id"], swarm["expected"]
    client = openai.OpenAI(base_url=a.base + "/v1", api_key=a.api_key, max_retries=0, timeout=120)
    raw = client.responses.with_raw_response.create(model=model_id, input=PROMPT, max_output_tokens=N, temperature=0)
    resp = raw.parse()
    assert raw.headers["x-swarm-route"] == "distributed"
    assert resp.output_text == expected
    with client.responses.stream(model=model_id, input=PROMPT, max_output_tokens=N, temperature=0) as stream:
        events = list(stream)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    assert events[-1].type == ("response.incomplete" if resp.status == "incomplete" else "response.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    follow = client.responses.create(model=model_id, input="and then?", previous_response_id=resp.id,
                                     max_output_tokens=2, temperature=0)
    assert follow.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens
    status, body = a.get("/api/admin/requests")
    assert status == 200
    trace = next(t for t in json.loads(body)["recent"] if t["request_id"] == raw.headers["x-request-id"])
    assert trace["operation"] == "responses" and trace["route"] == "distributed" and trace["outcome"] == "ok"
    assert len(trace["segments"]) == 2


async def _post(proc, path: str, body: dict) -> tuple[int, dict, object]:
    """(status, headers, JSON body or a stream's events) of a POST to the node's API."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s, s.post(
            proc.base + path, json=body, headers=proc.auth) as r:
        text = await r.text()
        if r.status == 200 and body.get("stream"):
            return r.status, dict(r.headers), [json.loads(d) for d in sse_data(text) if d != "[DONE]"]
        return r.status, dict(r.headers), json.loads(text)


def both(swarm, path: str, body: dict) -> tuple[object, object]:
    """The same request to the split (its route checked) and to the whole holder: both bodies."""
    async def go():
        return await _post(swarm["a"], path, body), await _post(swarm["whole"], path, body)
    (s_split, h_split, split), (s_whole, h_whole, whole) = run(go())
    assert (s_split, s_whole) == (200, 200), (split, whole)
    if "x-swarm-route" in h_whole:
        assert h_split["x-swarm-route"] == "distributed" and h_whole["x-swarm-route"] == "local"
    return split, whole


def _native(body: dict) -> dict:
    """A native reply without what differs by route or run: timings, settings, KV cache hits."""
    return {k: v for k, v in body.items() if k not in ("timings", "generation_settings", "tokens_cached")}


CODE_PRE, CODE_SUF = "def add(a, b):\n    ", "\n    return total\n"


def test_fill_in_the_middle_over_the_split_equals_whole(swarm):
    model_id = swarm["model_id"]
    body = {"model": model_id, "prompt": CODE_PRE, "suffix": CODE_SUF, "max_tokens": N, "temperature": 0}
    split, whole = both(swarm, "/v1/completions", body)
    for key in ("usage",):
        assert split[key] == whole[key]
    assert split["choices"] == whole["choices"]
    events, _ = both(swarm, "/v1/completions", {**body, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == whole["choices"][0]["text"]
    infill = {"input_prefix": CODE_PRE, "input_suffix": CODE_SUF, "prompt": "to",
              "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
              "n_predict": N, "temperature": 0}  # no `model`: the one the node serves
    split, whole = both(swarm, "/infill", infill)
    assert _native(split) == _native(whole) and split["tokens_evaluated"] > 10
    events, _ = both(swarm, "/infill", {**infill, "stream": True})
    assert "".join(e["content"] for e in events) == whole["content"] and events[-1]["stop"] is True
    assert _native(events[-1]) == {**_native(whole), "content": ""}


def test_native_endpoints_over_the_split_equal_whole(swarm):
    body = {"prompt": PROMPT, "n_predict": N, "temperature": 0}
    split, whole = both(swarm, "/completion", body)
    assert _native(split) == _native(whole) and split["model"] == swarm["model_id"]
    assert split["generation_settings"]["n_ctx"] == whole["generation_settings"]["n_ctx"]
    events, _ = both(swarm, "/completion", {**body, "stream": True})
    assert "".join(e["content"] for e in events) == whole["content"]
    assert _native(events[-1]) == {**_native(whole), "content": ""}
    stopped, whole_stopped = both(swarm, "/completion", {**body, "stop": [whole["content"][3:6]]})
    assert _native(stopped) == _native(whole_stopped) and stopped["stop_type"] == "word"
    tokens, whole_tokens = both(swarm, "/tokenize", {"content": PROMPT, "with_pieces": True})
    assert tokens == whole_tokens
    # a node holding nothing of the model: no `model` names the one the swarm serves
    status, _, on_d = run(_post(swarm["d"], "/completion", body))
    assert status == 200 and _native(on_d) == _native(whole)
    props = {}
    for name in ("a", "d", "whole"):
        status, raw = swarm[name].get("/props")
        assert status == 200, raw
        props[name] = json.loads(raw)
    for name in ("a", "d"):
        for key in ("chat_template", "bos_token", "eos_token", "model_alias", "model_path", "total_slots"):
            assert props[name][key] == props["whole"][key], (name, key)
        assert props[name]["default_generation_settings"]["n_ctx"] == \
            props["whole"]["default_generation_settings"]["n_ctx"]


def test_time_limit_over_the_split_ends_at_a_line_end(swarm):
    """Only a token that writes a newline is checked against the limit (llama-server's rule): the
    reply ends at a line's end or runs to max_tokens, on either route. The chain takes well over
    1 ms for a few tokens, so there it ends at the second newline; the whole holder, which may write
    them all within 1 ms, gives that text or the full one, never a line cut short."""
    # greedy on this file: a newline first, a second at token 9, none after (up to max_tokens)
    body = {"model": swarm["model_id"], "prompt": "def in ret", "max_tokens": 40, "temperature": 0}
    split, whole = both(swarm, "/v1/completions", body)
    assert split["choices"] == whole["choices"]
    full = whole["choices"][0]["text"]
    assert full.count("\n") >= 2 and full.index("\n") == 0, full  # (what the test needs)
    cut = full[:full.index("\n", 1) + 1]
    split, whole = both(swarm, "/v1/completions", {**body, "t_max_predict_ms": 1})
    assert split["choices"][0]["text"] == cut and split["choices"][0]["finish_reason"] == "length"
    assert whole["choices"][0]["text"] in (cut, full) and whole["choices"][0]["finish_reason"] == "length"
    assert split["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    events, _ = both(swarm, "/v1/completions", {**body, "t_max_predict_ms": 1, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == cut
    native = {"prompt": body["prompt"], "n_predict": 40, "temperature": 0, "t_max_predict_ms": 1}
    split, whole_native = both(swarm, "/completion", native)
    assert split["content"] == cut and split["stop_type"] == "limit"
    assert whole_native["content"] in (cut, full) and whole_native["stop_type"] == "limit"
    # the chain is free again: the next request is served in full
    again, _ = both(swarm, "/v1/completions", body)
    assert again["choices"][0]["text"] == full


def prompt_tokens(usage: dict) -> int:
    """An Anthropic usage's prompt: read from a KV cache or not."""
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]


def test_anthropic_documents_and_responses_options_over_the_split_equal_whole(swarm):
    messages = [
        {"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "the swarm runs"},
             "title": "notes", "context": "from the wiki"},
            {"type": "search_result", "source": "https://example.org/swarm", "title": "swarm",
             "content": [{"type": "text", "text": "peers split the layers"}]}]},
        {"role": "user", "content": PROMPT},  # consecutive user turns: merged into one
    ]
    body = {"model": swarm["model_id"], "max_tokens": N, "messages": messages, "temperature": 0}
    split, whole = both(swarm, "/v1/messages", body)
    assert {k: split[k] for k in ("content", "stop_reason", "stop_sequence")} == \
        {k: whole[k] for k in ("content", "stop_reason", "stop_sequence")}
    assert prompt_tokens(split["usage"]) == prompt_tokens(whole["usage"])  # (cache reads differ by route)
    assert split["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    events, _ = both(swarm, "/v1/messages", {**body, "stream": True})
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "".join(b["text"] for b in whole["content"])
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == whole["stop_reason"]
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    resp = {"model": swarm["model_id"], "input": PROMPT, "max_output_tokens": N, "temperature": 0,
            "reasoning": {"effort": "low", "summary": "auto"}, "include": ["reasoning.encrypted_content"]}
    split, whole = both(swarm, "/v1/responses", resp)
    assert split["output"][0]["content"] == whole["output"][0]["content"]
    assert split["status"] == whole["status"]
    assert [split["usage"][k] for k in ("input_tokens", "output_tokens")] == \
        [whole["usage"][k] for k in ("input_tokens", "output_tokens")]



def _ollama(body: dict) -> dict:
    """An Ollama reply without what differs by route or run: its time and durations."""
    return {k: v for k, v in body.items() if k != "created_at" and not k.endswith("duration")}


def test_ollama_over_the_split_equals_whole(swarm):
    """Ollama's dialect (2026-12-07) over the split, and its model routes on a node holding nothing."""
    model_id = swarm["model_id"]
    body = {"model": f"{model_id}:latest", "prompt": PROMPT, "raw": True, "stream": False,
            "options": {"num_predict": N, "temperature": 0}}
    split, whole = both(swarm, "/api/generate", body)
    assert _ollama(split) == _ollama(whole)
    status, _, native = run(_post(swarm["whole"], "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0}))
    assert split["response"] == native["content"]  # raw: the prompt as llama-server's /completion takes it
    assert split["eval_count"] == N and split["done_reason"] == "length"
    chat = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "stream": False,
            "options": {"num_predict": N, "temperature": 0}}
    split, whole = both(swarm, "/api/chat", chat)
    assert _ollama(split) == _ollama(whole)
    for name in ("a", "d"):
        status, raw = swarm[name].get("/api/tags")
        assert status == 200 and f"{model_id}:latest" in [m["name"] for m in json.loads(raw)["models"]], (name, raw)
    status, _, shown = run(_post(swarm["d"], "/api/show", {"model": model_id}))
    status_whole, _, shown_whole = run(_post(swarm["whole"], "/api/show", {"model": model_id}))
    assert status == status_whole == 200
    assert {k: shown[k] for k in ("details", "capabilities", "template")} == \
        {k: shown_whole[k] for k in ("details", "capabilities", "template")}


def test_constraints_and_ignore_eos_over_the_split_equal_whole(swarm):
    """llama-server's `grammar`, vLLM's guided_regex / guided_choice, `ignore_eos` and `min_tokens`
    reach the segment that samples: the split answers what the whole holder does, and it matches."""
    from node.inference.tokenizer import ModelTokenizer

    tok = ModelTokenizer(swarm["model"])
    try:
        ends = {str(i): 100 for i in tok.eog_ids()}  # the model would end at once
    finally:
        tok.close()
    base = {"model": swarm["model_id"], "prompt": PROMPT, "max_tokens": 30, "temperature": 0}

    def tokens(reply):  # (the cached share differs by route)
        return reply["usage"]["prompt_tokens"], reply["usage"]["completion_tokens"]

    for extra, pattern in (({"grammar": 'root ::= [a-z]{3,8} " " [0-9]{1,3}'}, r"[a-z]{3,8} [0-9]{1,3}"),
                           ({"guided_regex": r"[a-c]{4}/[0-9]{2}"}, r"[a-c]{4}/[0-9]{2}"),
                           ({"guided_choice": ["swarm", "bee", "hive"]}, r"swarm|bee|hive")):
        split, whole = both(swarm, "/v1/completions", {**base, **extra})
        assert split["choices"] == whole["choices"] and tokens(split) == tokens(whole)
        assert re.fullmatch(pattern, split["choices"][0]["text"]), (extra, split["choices"][0]["text"])
        assert split["choices"][0]["finish_reason"] == "stop"
    for extra, n, finish in (({"ignore_eos": True}, N, "length"), ({"min_tokens": 4}, 4, "stop")):
        split, whole = both(swarm, "/v1/completions", {**base, "max_tokens": N, "logit_bias": ends, **extra})
        assert split["choices"] == whole["choices"] and tokens(split) == tokens(whole)
        assert split["usage"]["completion_tokens"] == n and split["choices"][0]["finish_reason"] == finish
