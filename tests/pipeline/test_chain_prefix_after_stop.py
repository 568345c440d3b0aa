"""A chain's kept KV survives a reply cut by a stop sequence.

When a stop sequence matches, the coordinator has already sent the next decode step ("the next
step before the stream"), so SESSION_END `keep` reaches a segment while that step of the ended
attempt is still computing there. The step's outcome is then dropped (its session ended), but that
must not free the session just kept: the conversation's next turn resumes it (a hit), instead of
finding it gone on a segment and prefilling the whole conversation again."""

from __future__ import annotations

import itertools
import re

import openai
import pytest

from tests.pipeline.swarm import llama_greedy, run, split_model, start_chain3, wait_for_route, wait_peers

pytestmark = [pytest.mark.llama, pytest.mark.slow]

N = 24
OPENER = "tell me about the swarm"


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("prefixstop")
    model = split_model(base)
    procs = a, b, c = start_chain3(base, model, first_extra=["-vv"])
    try:
        async def ready():
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 2)
            return await wait_for_route(a, "split6")
        yield {"model": model, "model_id": run(ready()), "nodes": procs}
    finally:
        for p in procs:
            p.terminate()


def test_turns_cut_by_a_stop_sequence_resume_their_kept_sessions(swarm):
    a = swarm["nodes"][0]
    client = openai.OpenAI(base_url=a.base + "/v1", api_key=a.api_key, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": OPENER}]
    full = llama_greedy(swarm["model"], messages, N)
    stop = full[len(full) // 2:len(full) // 2 + 3]  # matched mid-reply, decode steps still to come
    assert stop and full.index(stop) > 0, full
    turns = []
    for i in range(4):
        resp = client.chat.completions.create(model=swarm["model_id"], messages=messages, max_tokens=N,
                                              temperature=0, stop=[stop])
        text = resp.choices[0].message.content
        details = resp.usage.prompt_tokens_details
        turns.append((resp.choices[0].finish_reason, resp.usage.prompt_tokens, details.cached_tokens if details else 0))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then {i}?"}]
    assert turns[0][0] == "stop", turns
    gone = re.findall(r"DIAG: KV-cache MISS — kept session gone on a segment.*", a.node_log())
    assert not gone, gone
    # every later turn resumed the previous turn's kept session: at least that turn's whole prompt
    for (_, prev_prompt, _), (_, _, cached) in itertools.pairwise(turns):
        assert cached >= prev_prompt, turns
