"""llama-server's own endpoints, as apps written for llama.cpp call them (SillyTavern's "llama.cpp"
backend: /completion, /props, /tokenize, /detokenize; llama.vscode and llama.vim: /infill; scripts:
/apply-template). Until 2026-12-06 each was a 404. Raw HTTP (aiohttp) against a real node holding a
tiny llama and a tiny code model with FIM tokens; the key as on /v1; shapes from llama.cpp's server
README and tests (tools/server/tests/unit/test_completion.py, test_infill.py, test_tokenize.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import string

import aiohttp
import pytest
import pytest_asyncio

from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.sse import sse_data

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

PROMPT = "Once upon a time"
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n    return total\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("llamanative")
    fim = tiny_model(base, dataclasses.replace(TINY, fim=True, name="tiny-fim"), name="fim.gguf")
    async with running_node(node_config(base / "data", tiny_model(base), fim)) as n:
        yield n


def served(node, name: str):
    return next(m for m in node.models.all() if m.entry.path.name == name)


async def call(node, path: str, body: dict | None = None, *, key: bool = True, method: str = "POST"):
    """(status, the body as text) of one request on the node's API."""
    headers = {"Authorization": f"Bearer {node.api_key}"} if key else {}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"http://127.0.0.1:{node.api.port}{path}", json=body,
                                   headers=headers) as resp:
            return resp.status, await resp.text()


async def test_completion_whole_and_streamed_in_llama_servers_shape(node):
    """SillyTavern's request: `prompt`, `n_predict`, its sampler set; no `model` (llama-server serves one)."""
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": True, "typical_p": 1,
            "samplers": ["top_k", "top_p", "temperature"], "n_indent": 0, "t_max_predict_ms": 500}
    status, text = await call(node, "/completion", body)
    assert status == 200, text
    whole = json.loads(text)
    tiny = served(node, "tiny.gguf")
    assert whole["stop"] is True and whole["model"] == tiny.id
    assert whole["stop_type"] in ("limit", "eos") and isinstance(whole["content"], str)
    assert whole["tokens_predicted"] == whole["timings"]["predicted_n"] > 0
    assert whole["tokens_evaluated"] == whole["timings"]["prompt_n"] == len(tiny.tokenizer.tokenize(PROMPT))
    assert whole["generation_settings"]["n_ctx"] == tiny.n_ctx
    # the same greedy text /v1/completions writes
    status, text = await call(node, "/v1/completions", {"model": tiny.id, "prompt": PROMPT, "max_tokens": 8,
                                                         "temperature": 0})
    assert json.loads(text)["choices"][0]["text"] == whole["content"]
    status, text = await call(node, "/completion", {**body, "stream": True})
    assert status == 200, text
    events = [json.loads(d) for d in sse_data(text)]  # JSON only: no "[DONE]", as llama-server
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"]
    assert events[-1]["stop_type"] == whole["stop_type"] and "timings" in events[-1]


async def test_completion_stop_word_and_response_fields(node):
    tiny = served(node, "tiny.gguf")
    status, text = await call(node, "/completion", {"model": tiny.id, "prompt": PROMPT, "n_predict": 12,
                                                    "temperature": 0})
    full = json.loads(text)["content"]
    word = full[len(full) // 2:][:2]
    if not word.strip():
        pytest.skip("the tiny model's reply has no usable stop word")
    status, text = await call(node, "/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0,
                                                    "stop": [word],
                                                    "response_fields": ["content", "generation_settings/n_ctx"]})
    got = json.loads(text)
    assert got == {"content": full[:full.index(word)], "n_ctx": tiny.n_ctx}


async def test_the_native_routes_need_the_key_as_v1_does(node):
    for path in ("/completion", "/infill", "/tokenize", "/detokenize", "/apply-template"):
        status, _ = await call(node, path, {}, key=False)
        assert status == 401, path
    status, _ = await call(node, "/props", key=False, method="GET")
    assert status == 401


async def test_tokenize_and_detokenize(node):
    tok = served(node, "tiny.gguf").tokenizer
    text = "Hello world, hello"
    status, body = await call(node, "/tokenize", {"content": text})
    assert status == 200, body
    ids = json.loads(body)["tokens"]
    assert ids == tok.tokenize(text, add_bos=False)  # add_special defaults to false, as llama-server
    status, body = await call(node, "/tokenize", {"content": text, "add_special": True})
    assert json.loads(body)["tokens"] == [tok.bos_id, *ids]
    status, body = await call(node, "/tokenize", {"content": text, "with_pieces": True})
    pieces = json.loads(body)["tokens"]
    # a SentencePiece vocabulary writes the first word's space (llama-server's test strips it too)
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces).strip() == text
    status, body = await call(node, "/detokenize", {"tokens": ids})
    assert status == 200 and json.loads(body)["content"].strip() == text
    status, body = await call(node, "/detokenize", {"tokens": [10**6]})
    assert status == 400 and json.loads(body)["error"]["param"] == "tokens"


async def test_infill_with_extra_context_and_a_started_middle(node):
    fim = served(node, "fim.gguf")
    tok = fim.tokenizer
    extra = [{"filename": "util.py", "text": "def total(xs):\n    return sum(xs)\n"}]
    body = {"model": fim.id, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra,
            "prompt": "total", "n_predict": 6, "temperature": 0}
    status, text = await call(node, "/infill", body)
    assert status == 200, text
    got = json.loads(text)
    want = tok.infill_tokens(PREFIX, SUFFIX, (("util.py", extra[0]["text"]),), "total")
    assert tok.add_bos and want.index(tok.bos_id) > 0  # the other files before BOS, as llama-server puts them
    assert got["tokens_evaluated"] == len(want) > len(tok.infill_tokens(PREFIX, SUFFIX))
    assert got["tokens_predicted"] > 0
    # without extra and middle it is /v1/completions' `suffix`
    status, text = await call(node, "/infill", {"model": fim.id, "input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                "n_predict": 6, "temperature": 0})
    plain = await call(node, "/v1/completions", {"model": fim.id, "prompt": PREFIX, "suffix": SUFFIX,
                                                  "max_tokens": 6, "temperature": 0})
    assert json.loads(text)["content"] == json.loads(plain[1])["choices"][0]["text"]
    # llama.vscode sends no `model`: the node's code model, though a chat model comes first
    status, text = await call(node, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                                                "temperature": 0})
    assert status == 200, text
    assert json.loads(text)["model"] == fim.id and json.loads(text)["content"] == json.loads(plain[1])["choices"][0]["text"]
    for bad in ({}, {"filename": "ok"}, {"filename": 123, "text": "abc"}):
        status, text = await call(node, "/infill", {**body, "input_extra": [bad]})
        assert status == 400 and json.loads(text)["error"]["param"] == "input_extra"
    status, text = await call(node, "/infill", {"model": fim.id, "input_prefix": PREFIX})
    assert status == 400 and json.loads(text)["error"]["param"] == "input_suffix"


async def test_props_and_apply_template(node):
    tiny = served(node, "tiny.gguf")
    status, text = await call(node, "/props", method="GET")
    assert status == 200, text
    props = json.loads(text)
    assert props["default_generation_settings"]["n_ctx"] == tiny.n_ctx
    assert props["model_alias"] == tiny.id and props["chat_template"]
    messages = [{"role": "user", "content": "hi"}]
    status, text = await call(node, "/apply-template", {"messages": messages})
    assert status == 200, text
    assert json.loads(text)["prompt"] == tiny.tokenizer.render_chat(messages)


def _megabyte() -> str:
    rnd = random.Random(0)
    return "".join(rnd.choice(string.ascii_letters + " ") for _ in range(1_000_000))


async def test_a_megabyte_to_tokenize_does_not_stall_the_loop(node):
    """The reply of a big /tokenize (with its pieces) is megabytes of JSON: serialised on the loop
    it stalled every stream and the peers' pings for seconds (found in review: 11 s for 7 MB). The
    loop police fails this test on a step of the node's over 0.25 s of CPU; the test's own big work
    runs in threads."""
    content = await asyncio.to_thread(_megabyte)
    headers = {"Authorization": f"Bearer {node.api_key}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{node.api.port}/tokenize", headers=headers,
                                json={"content": content, "with_pieces": True}) as resp:
            assert resp.status == 200
            data = await resp.read()

        def pieces_and_ids() -> tuple[str, str]:
            tokens = json.loads(data)["tokens"]
            return "".join(t["piece"] for t in tokens), json.dumps({"tokens": [t["id"] for t in tokens]})

        joined, body = await asyncio.to_thread(pieces_and_ids)
        assert joined.strip() == content.strip()
        async with session.post(f"http://127.0.0.1:{node.api.port}/detokenize", data=body,
                                headers={**headers, "Content-Type": "application/json"}) as resp:
            assert resp.status == 200
            text = (await asyncio.to_thread(json.loads, await resp.read()))["content"]
    assert text.strip() == content.strip()
