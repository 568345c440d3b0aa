"""An unload refused (409) while requests use the model says how many: every running request and
every waiting one. Until 2026-12-06 it counted the running ones as one (`int(busy)`): with 4
streams decoding and 2 queued it said "in use by 3 request(s)"."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from node.resources import default_model_path
from tests.support.nodes import default_model_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama,
              pytest.mark.skipif(not default_model_path().exists(),
                                 reason="the embedded default model is not in this checkout")]

node = default_model_node("unload-in-use")


async def test_the_409_counts_every_running_and_waiting_request(node):
    served = node.models.all()[0]
    base = f"http://127.0.0.1:{node.api.port}"
    headers = {"Authorization": f"Bearer {node.api_key}"}
    tok = served.tokenizer
    no_eos = {str(t): -100 for t in range(tok.n_vocab) if tok.is_eog(t)}
    running = served.lock.limit  # max_concurrent
    async with aiohttp.ClientSession() as session:

        async def stream(i: int):
            body = {"model": served.id, "stream": True, "max_tokens": 900, "temperature": 1, "seed": i,
                    "logit_bias": no_eos, "messages": [{"role": "user", "content": f"Say {i}"}]}
            async with session.post(f"{base}/v1/chat/completions", headers=headers, json=body) as r:
                async for _ in r.content:
                    pass

        tasks = [asyncio.create_task(stream(i)) for i in range(running + 2)]
        try:
            await wait_until(lambda: served.lock.holders == running and served.waiting == 2, timeout_s=30)
            async with session.post(f"{base}/api/admin/models/{served.id}/unload", headers=headers) as r:
                status, body = r.status, json.loads(await r.text())
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert status == 409
    assert f"in use by {running + 2} request(s)" in body["error"]["message"], body


async def test_a_forced_unload_ends_running_and_queued_requests_with_an_error(node):
    """unload?force=1 while requests stream and others queue: a running stream ends with an error
    event (it had ended like a finished reply: finish_reason "length", outcome ok, so an app took the
    cut text for the answer), a queued request gets a 503 at once (it used to run all its tokens
    first, the unload waiting behind it), and the unload is done in seconds."""
    served = node.models.all()[0]
    base = f"http://127.0.0.1:{node.api.port}"
    headers = {"Authorization": f"Bearer {node.api_key}"}
    tok = served.tokenizer
    no_eos = {str(t): -100 for t in range(tok.n_vocab) if tok.is_eog(t)}
    running = served.lock.limit
    got: dict[int, tuple[int, str]] = {}
    async with aiohttp.ClientSession() as session:

        async def stream(i: int):
            body = {"model": served.id, "stream": True, "max_tokens": 900, "temperature": 1, "seed": i,
                    "logit_bias": no_eos, "messages": [{"role": "user", "content": f"Count to {i}"}]}
            async with session.post(f"{base}/v1/chat/completions", headers=headers, json=body) as r:
                got[i] = (r.status, (await r.read()).decode())

        tasks = [asyncio.create_task(stream(i)) for i in range(running + 2)]
        try:
            await wait_until(lambda: served.lock.holders == running and served.waiting == 2, timeout_s=30)
            began = asyncio.get_running_loop().time()
            async with session.post(f"{base}/api/admin/models/{served.id}/unload?force=1", headers=headers) as r:
                assert r.status == 200, await r.text()
            took = asyncio.get_running_loop().time() - began
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert took < 10, took
    assert served.state == "unloaded"
    streamed = [text for status, text in got.values() if status == 200]
    refused = [text for status, text in got.values() if status == 503]
    assert len(streamed) == running and len(refused) == 2, {i: (s, t[:200]) for i, (s, t) in got.items()}
    for text in streamed:  # some text, then the error event, never a finish_reason
        assert '"model_unavailable"' in text and '"finish_reason":"length"' not in text, text[-600:]
    for text in refused:
        assert '"model_unavailable"' in text, text
