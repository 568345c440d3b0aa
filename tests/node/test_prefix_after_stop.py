"""The local route's prefix cache keeps a reply that a stop sequence ended.

A stop sequence ends the reply early: the engine is told to stop, but the reply is complete, not
abandoned, so its sequence's KV stays cached like one that ended at EOS or max_tokens, and the
conversation's next turn (which sends the reply back) resumes it. Before, the stop was a cancel:
the sequence left the KV at once and every later turn of an app that sends stop strings prefilled
the whole conversation again. (A random-weight model that does not end its turn, with a large
max_tokens: the engine is still generating when the stop sequence matches.)"""

from __future__ import annotations

import itertools

import openai
import pytest
import pytest_asyncio

from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("prefixstop")
    async with running_node(node_config(base / "data", split_model(base), kv_cache_seqs=4)) as n:
        yield n


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_turn_cut_by_a_stop_sequence_is_resumed_by_the_next(node, stream):
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)
    model = node.models.all()[0].id
    opener = [{"role": "user", "content": f"tell me about the swarm ({'stream' if stream else 'json'})"}]
    full = (await client.chat.completions.create(model=model, messages=opener, max_tokens=24, temperature=0)
            ).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert len(stop) == 3 and full.index(stop) > 0, full
    messages, turns = list(opener), []
    for i in range(3):
        if stream:
            text, usage = "", None
            async for chunk in await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=200, temperature=0, stop=[stop], stream=True,
                    stream_options={"include_usage": True}):
                text += "".join(c.delta.content or "" for c in chunk.choices)
                usage = chunk.usage or usage
        else:
            resp = await client.chat.completions.create(model=model, messages=messages, max_tokens=200,
                                                        temperature=0, stop=[stop])
            text, usage = resp.choices[0].message.content, resp.usage
        turns.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, usage.completion_tokens))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then {i}?"}]
        if i == 0:
            assert full.startswith(text) and usage.completion_tokens < 24, (full, text)
    # each later turn resumed the previous turn's sequence: at least that turn's whole prompt is cached
    for (prev_prompt, _, _), (_, cached, _) in itertools.pairwise(turns):
        assert cached >= prev_prompt, turns
