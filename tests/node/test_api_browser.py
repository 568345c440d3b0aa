"""What a browser app and the SDKs' retry logic need from a real node: CORS when configured
(`cors_origins` was read nowhere: a page on localhost:3000 failed its preflight with a 401, found
by a compatibility run on 2026-12-06), none by default, and Retry-After on a 429."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from tests.support.nodes import node_config, running_node, tiny_model

pytestmark = pytest.mark.llama

APP = "http://localhost:3000"


async def _request(node, method, path, *, headers=None, body=None):
    async with aiohttp.ClientSession() as s, s.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", headers=headers or {},
            data=None if body is None else json.dumps(body)) as r:
        return r.status, r.headers, await r.text()


def _preflight(origin):
    return {"Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}


async def test_cors_for_configured_origins_only(tmp_path):
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model, cors_origins=[APP + "/"])) as node:
        path = "/v1/chat/completions"
        status, headers, _ = await _request(node, "OPTIONS", path, headers=_preflight(APP))
        assert status == 204 and headers["Access-Control-Allow-Origin"] == APP
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert headers["Access-Control-Allow-Headers"] == "authorization, content-type, x-stainless-os"
        status, headers, _ = await _request(node, "OPTIONS", path, headers=_preflight("http://evil.example"))
        assert status == 403 and "Access-Control-Allow-Origin" not in headers

        auth = {"Authorization": f"Bearer {node.api_key}", "Content-Type": "application/json", "Origin": APP}
        body = {"model": node.models.all()[0].id, "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 3, "stream": True}
        status, headers, text = await _request(node, "POST", path, headers=auth, body=body)
        assert status == 200 and text.rstrip().endswith("data: [DONE]")
        assert headers["Access-Control-Allow-Origin"] == APP  # on a stream, whose headers leave first
        assert "x-swarm-route" in headers["Access-Control-Expose-Headers"]
        status, headers, _ = await _request(node, "POST", path, headers={**auth, "Authorization": "Bearer no"}, body=body)
        assert status == 401 and headers["Access-Control-Allow-Origin"] == APP  # the page can read why
        status, headers, _ = await _request(node, "POST", path, headers={**auth, "Origin": "http://evil.example"},
                                            body=body)
        assert status == 200 and "Access-Control-Allow-Origin" not in headers

    async with running_node(node_config(tmp_path / "data2", model)) as node:  # the default: no CORS
        status, headers, _ = await _request(node, "OPTIONS", "/v1/chat/completions", headers=_preflight(APP))
        assert status == 401 and "Access-Control-Allow-Origin" not in headers


async def test_a_full_queue_says_when_to_retry(tmp_path):
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model, max_queue_per_model=0)) as node:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                                    max_retries=0)
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model=node.models.all()[0].id, max_tokens=2,
                                                 messages=[{"role": "user", "content": "x"}])
        assert caught.value.response.headers["Retry-After"] == "1"
