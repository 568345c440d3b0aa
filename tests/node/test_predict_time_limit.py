"""llama-server's `t_max_predict_ms`: llama.vscode and llama.vim send it so a code completion stays
short. The reply ends at the first token that writes a newline once the time since the first
token is past the limit (finish_reason "length"; /completion's stop_type "limit"), on /v1 and on
the native /completion. Until 2026-12-06 it was a 400 on /v1 and ignored on /completion, so
completions ran to n_predict. Real node, the default model, greedy."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

PROMPT = "def join(a, *paths):\n"
N = 64

node = default_model_node("time-limit")


async def complete(node, path: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{node.api.port}{path}", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        text = await r.text()
        assert r.status == 200, text
        return json.loads(text)


async def greedy(node, max_tokens: int, **extra) -> dict:
    return await complete(node, "/v1/completions", {"model": node.models.all()[0].id, "prompt": PROMPT,
                                                     "max_tokens": max_tokens, "temperature": 0, **extra})


async def test_a_reply_past_its_time_limit_ends_at_a_line_end(node):
    full = (await greedy(node, N))["choices"][0]["text"]
    assert full.count("\n") >= 2, full  # (the test needs a reply of several lines)
    cut = await greedy(node, N, t_max_predict_ms=1)
    text, used = cut["choices"][0]["text"], cut["usage"]["completion_tokens"]
    assert cut["choices"][0]["finish_reason"] == "length" and used < N
    assert full.startswith(text) and "\n" in text
    # it ended at a token that wrote a newline (llama-server's rule: the cut is at a line's end)
    before = (await greedy(node, used - 1))["choices"][0]["text"]
    assert text.startswith(before) and "\n" in text[len(before):], (before, text)
    native = await complete(node, "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                                  "t_max_predict_ms": 1})
    assert native["content"] == text and native["stop_type"] == "limit"
    assert (await greedy(node, N, t_max_predict_ms=0))["choices"][0]["text"] == full  # 0: no limit


async def test_a_bad_time_limit_is_a_400_naming_it(node):
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{node.api.port}/v1/completions",
            json={"model": node.models.all()[0].id, "prompt": PROMPT, "t_max_predict_ms": "soon"},
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 400 and (await r.json())["error"]["param"] == "t_max_predict_ms"
