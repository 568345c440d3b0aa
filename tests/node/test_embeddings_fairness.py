"""A long /v1/embeddings request (an app indexing its documents) must not stop the node's chat:
a short completion that comes while the embeddings run is served between them, not after the
last input. Both share the model's one executor thread; until 2026-12-06 the whole input list
was embedded in one call on it, and a 5-token chat request waited 21 s (ttft) behind 300 inputs
on the 110M bench model, minutes behind an app's 2048."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from node.resources import default_model_path
from tests.support.nodes import default_model_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama,
              pytest.mark.skipif(not default_model_path().exists(),
                                 reason="the embedded default model is not in this checkout")]

node = default_model_node("embed-fair")

# 128 inputs of 70 tokens: seconds of embedding even for the default model (80 ms each here), a
# 4-token reply some ms
DOCUMENT = "def add(a, b):\n    return a + b\n" * 5
INPUTS = 128


async def test_a_chat_request_is_served_while_a_long_embeddings_request_runs(node):
    served = node.models.all()[0]
    base = f"http://127.0.0.1:{node.api.port}"
    headers = {"Authorization": f"Bearer {node.api_key}"}
    done: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def embeddings():
            async with session.post(f"{base}/v1/embeddings", headers=headers,
                                    json={"model": served.id, "input": [DOCUMENT] * INPUTS}) as r:
                body = await r.json()
            done["embeddings"] = time.monotonic()
            return r.status, len(body.get("data", []))

        async def chat():
            async with session.post(f"{base}/v1/chat/completions", headers=headers,
                                    json={"model": served.id, "max_tokens": 4, "temperature": 0,
                                          "messages": [{"role": "user", "content": "What is None?"}]}) as r:
                await r.read()
            done["chat"] = time.monotonic()
            return r.status

        assert await chat() == 200  # loaded, warm
        task = asyncio.create_task(embeddings())
        # the embedding context exists once the embeddings are running on the model's thread
        await wait_until(lambda: served.engine is not None and served.engine.embedder is not None, timeout_s=60)
        await asyncio.sleep(0.2)
        assert not task.done()
        assert await chat() == 200
        assert await task == (200, INPUTS)
    assert done["chat"] < done["embeddings"], (
        f"the chat request ended {done['chat'] - done['embeddings']:.1f} s after the embeddings: it waited for all of them")


async def test_an_embeddings_request_is_served_while_chat_requests_keep_coming(node):
    """The reverse: the batch loop kept the model's thread while any completion ran or waited, so
    under steady chat (two clients, each asking again as soon as its reply came) a one-word
    embeddings request got no answer in 60 s (110M bench model, 2026-12-06). Here more clients
    than the model runs at once (max_concurrent 4), so one always waits."""
    served = node.models.all()[0]
    base = f"http://127.0.0.1:{node.api.port}"
    headers = {"Authorization": f"Bearer {node.api_key}"}
    stop = asyncio.Event()
    tok = served.tokenizer
    no_eos = {str(t): -100 for t in range(tok.n_vocab) if tok.is_eog(t)}  # replies of their full length
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def chatter(i: int) -> int:
            replies = 0
            while not stop.is_set():
                async with session.post(f"{base}/v1/chat/completions", headers=headers,
                                        json={"model": served.id, "max_tokens": 150 + 37 * i, "temperature": 1, "seed": i,
                                              "logit_bias": no_eos,
                                              "messages": [{"role": "user", "content": f"Tell me about {i}"}]}) as r:
                    await r.read()
                    assert r.status == 200
                replies += 1
            return replies

        chatters = [asyncio.create_task(chatter(i)) for i in range(6)]
        try:
            # the batch loop runs without a pause: some completions are always running or waiting
            await wait_until(lambda: served.busy and node.traces.in_flight >= 6, timeout_s=30)
            await asyncio.sleep(0.5)
            started = time.monotonic()
            try:
                async with session.post(f"{base}/v1/embeddings", headers=headers,
                                        json={"model": served.id, "input": "hello"},
                                        timeout=aiohttp.ClientTimeout(total=45)) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
            except TimeoutError:
                pass
            waited = time.monotonic() - started
            assert not any(t.done() for t in chatters), "the chat stopped by itself: nothing was tested"
        finally:
            stop.set()
            replies = await asyncio.gather(*chatters)
    assert waited < 20, f"the embeddings request waited {waited:.1f} s for the chat to pause"
    assert min(replies) > 0
