"""logprobs on the distributed route, with the official `openai` client against real nodes on
127.0.0.1: a random-weight model over two nodes (a chain of slices) and through a remote holder of
the whole model; its logprobs equal the local route's (llama.cpp on a node holding the same GGUF
whole) within the slice engine's tolerance. The local route: tests/node/test_logprobs.py."""

from __future__ import annotations

import openai
import pytest

from tests.support.logprobs import chat_entries, check_entry

pytestmark = [pytest.mark.llama]


def chat_messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


# --- distributed route --------------------------------------------------------------------------
# split6 (random f32 weights): a chain of two slice nodes (a: layers 0-2, b: 3-5) coordinated by a;
# a node holding it whole (h, llama.cpp: the local route), and a coordinator (c) whose only route
# is h (remote generate, TOKENS frames). Sync tests with the sync client: no event loop here.

# The slice engine's known tolerance is 1e-3 of the logit scale (tests/inference/test_reference.py,
# f32 KV cache there); the node's llama.cpp keeps an f16 KV cache, and a logprob carries the error
# of the log-sum-exp as well: an absolute 1e-2 on this model's logprobs (measured: 9e-4 at most).
CHAIN_TOL = 1e-2
# TOKENS carry logprobs as float32: the remote holder's are the local route's up to that rounding
REMOTE_TOL = 1e-5


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    from tests.pipeline.swarm import (
        run,
        split_model,
        start_slice_node,
        start_whole_node,
        wait_for_route,
        wait_peers,
    )

    base = tmp_path_factory.mktemp("logprobs_swarm")
    model = split_model(base)
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    h = start_whole_node(base, "h", model)
    c = start_slice_node(base, "c", model, "0-0", bootstrap=[h.peer_port])
    procs = [a, b, h, c]
    try:
        async def ready():
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 1)
            await wait_peers(c, 1)
            return await wait_for_route(a, "split6")
        model_id = run(ready())
        yield {"model_id": model_id, "a": a, "h": h, "c": c}
    finally:
        for p in procs:
            p.terminate()


def sync_client(proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.base + "/v1", api_key=proc.api_key, max_retries=0, timeout=120)


def chat_logprobs(proc, model_id: str, *, top: int, stream: bool = False, content: str = "tell me about the swarm"):
    """(route, text, [(token, logprob, [(top token, logprob)])]) of a greedy chat with logprobs."""
    kw = dict(model=model_id, messages=chat_messages(content), max_tokens=16, temperature=0, logprobs=True,
              top_logprobs=top)
    client = sync_client(proc)
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**kw)
        reply = raw.parse()
        entries = chat_entries(reply.choices[0].logprobs)
        text, route = reply.choices[0].message.content, raw.headers["x-swarm-route"]
    else:
        text, entries = "", []
        with client.chat.completions.with_streaming_response.create(**kw, stream=True) as resp:
            route = resp.headers["x-swarm-route"]
            for chunk in resp.parse():
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    if chunk.choices[0].logprobs is not None:
                        entries += chat_entries(chunk.choices[0].logprobs)
    return route, text, [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in entries]


def assert_close(got, want, tol: float) -> None:
    assert [t for t, _lp, _top in got] == [t for t, _lp, _top in want]
    for (token, lp, top), (_t, want_lp, want_top) in zip(got, want, strict=True):
        assert abs(lp - want_lp) <= tol, (token, lp, want_lp)
        assert [v for _t, v in top] == pytest.approx([v for _t, v in want_top], abs=tol)
        check_entry(token, lp, top, len(want_top))


@pytest.mark.slow
def test_chain_logprobs_equal_the_local_routes(swarm):
    model_id = swarm["model_id"]
    route, local_text, local = chat_logprobs(swarm["h"], model_id, top=5)
    assert route == "local" and local
    for stream in (False, True):
        route, text, chain = chat_logprobs(swarm["a"], model_id, top=5, stream=stream)
        assert route == "distributed"
        assert text == local_text
        assert_close(chain, local, CHAIN_TOL)


@pytest.mark.slow
def test_remote_holder_logprobs_equal_the_local_routes(swarm):
    model_id = swarm["model_id"]
    _route, local_text, local = chat_logprobs(swarm["h"], model_id, top=20)
    for stream in (False, True):
        route, text, remote = chat_logprobs(swarm["c"], model_id, top=20, stream=stream)
        assert route == "distributed"
        assert text == local_text
        assert_close(remote, local, REMOTE_TOL)


@pytest.mark.slow
def test_distributed_completions_shape(swarm):
    model_id = swarm["model_id"]
    replies = {name: sync_client(swarm[name]).completions.create(model=model_id, prompt="the swarm", max_tokens=8,
                                                                 temperature=0, logprobs=2)
               for name in ("h", "a", "c")}
    want = replies["h"].choices[0].logprobs
    for name in ("a", "c"):
        lp = replies[name].choices[0].logprobs
        assert lp.tokens == want.tokens and lp.text_offset == want.text_offset
        assert lp.token_logprobs == pytest.approx(want.token_logprobs, abs=CHAIN_TOL)
        assert all(len(top) == 2 for top in lp.top_logprobs)
    off = sync_client(swarm["a"]).completions.create(model=model_id, prompt="the swarm", max_tokens=4, temperature=0)
    assert off.choices[0].logprobs is None
