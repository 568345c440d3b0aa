"""Many requests at once on a 3-segment chain on 127.0.0.1: the segments run the steps queued at
the same moment as one forward (batched sessions), and every request's text is what it gets alone,
greedy and seeded (f32 slices). A request cancelled among them frees its sessions and leaves the
others' text as it was."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import openai
import pytest

from tests.pipeline.swarm import run, split_model, start_chain3, wait_for_route, wait_peers
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

N = 24
PROMPTS = [f"request number {i}: tell me about part {i} of the swarm" for i in range(8)]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("chainbatch")
    model = split_model(base)
    nodes = start_chain3(base, model, first_extra=["-vv"])
    try:
        async def ready():
            for p in nodes:
                await p.async_wait_ready()
            await wait_peers(nodes[0], 2)
            return await wait_for_route(nodes[0], "split6")
        yield {"model": model, "model_id": run(ready()), "nodes": nodes}
    finally:
        for p in nodes:
            p.terminate()


async def _complete(session, proc, model_id: str, prompt: str, **params) -> str:
    body = {"model": model_id, "prompt": prompt, "max_tokens": N, **params}
    async with session.post(proc.base + "/v1/completions", json=body, headers=proc.auth) as r:
        data = await r.json()
        assert r.status == 200, data
        assert r.headers["x-swarm-segments"] == "3"
        return data["choices"][0]["text"]


def _batched_forwards(proc) -> list[int]:
    return [int(n) for n in re.findall(r"SplitModel forward pass complete .*batch=(\d+)", proc.node_log())]


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95}],
                         ids=["greedy", "seeded"])
def test_eight_requests_at_once_give_each_its_text_alone(swarm, params):
    a = swarm["nodes"][0]
    seeded = params["temperature"] > 0

    def with_seed(i):
        return {**params, "seed": 1000 + i} if seeded else params

    async def go():
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            alone = [await _complete(s, a, swarm["model_id"], p, **with_seed(i)) for i, p in enumerate(PROMPTS)]
            before = len(_batched_forwards(a))
            together = await asyncio.gather(*(_complete(s, a, swarm["model_id"], p, **with_seed(i))
                                              for i, p in enumerate(PROMPTS)))
            return alone, together, _batched_forwards(a)[before:]
    alone, together, batches = run(go())
    assert together == alone
    assert len(set(alone)) >= 4  # (the random model repeats itself) texts that differ stay apart
    assert batches and max(batches) >= 4, batches  # a's slice ran several sessions' steps at once


def test_a_cancelled_request_among_them_frees_its_sessions(swarm):
    a, b, c = swarm["nodes"]

    async def go():
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            alone = [await _complete(s, a, swarm["model_id"], p, temperature=0) for p in PROMPTS[:4]]

            async def cancelled():  # streams, reads a few chunks, hangs up
                body = {"model": swarm["model_id"], "prompt": PROMPTS[7], "max_tokens": 200, "temperature": 0,
                        "stream": True}
                async with s.post(a.base + "/v1/completions", json=body, headers=a.auth) as r:
                    assert r.status == 200
                    chunks = 0
                    async for _ in r.content:
                        chunks += 1
                        if chunks == 6:
                            return
            together = await asyncio.gather(cancelled(), *(_complete(s, a, swarm["model_id"], p, temperature=0)
                                                           for p in PROMPTS[:4]))
            return alone, list(together[1:])
    alone, together = run(go())
    assert together == alone

    async def freed():
        for p in (a, b, c):
            stats = await p.async_get_json("/api/admin/stats")
            if stats["kv_sessions"] or stats["in_flight"]["pipelines"]:
                return False
        return True
    run(wait_until(freed, 30, 0.1, "every segment to free the cancelled request's session"))


def test_n_choices_over_the_chain_are_each_the_reply_of_their_seed(swarm):
    """OpenAI's `n` on the split route, with the official client: choice i is the request with n=1
    and seed + i (its sessions batched with the other choices'), greedy choices are equal, a stream
    reassembled is the body, usage counts the prompt once."""
    a, model_id = swarm["nodes"][0], swarm["model_id"]
    client = openai.OpenAI(base_url=a.base + "/v1", api_key=a.api_key, max_retries=0, timeout=300)
    kw = {"model": model_id, "prompt": PROMPTS[1], "max_tokens": N}
    raw = client.completions.with_raw_response.create(n=3, temperature=2.0, seed=2000, **kw)
    assert raw.headers["x-swarm-route"] == "distributed" and raw.headers["x-swarm-segments"] == "3"
    reply = raw.parse()
    alone = [client.completions.create(temperature=2.0, seed=2000 + i, **kw) for i in range(3)]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == [r.choices[0].text for r in alone]
    assert len({c.text for c in reply.choices}) > 1
    assert reply.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert reply.usage.completion_tokens == sum(r.usage.completion_tokens for r in alone)
    greedy = client.completions.create(n=2, temperature=0, **kw)
    assert greedy.choices[0].text == greedy.choices[1].text == client.completions.create(temperature=0, **kw).choices[0].text
    texts = ["", "", ""]
    for chunk in client.completions.create(n=3, temperature=2.0, seed=2000, stream=True, **kw):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in reply.choices]
