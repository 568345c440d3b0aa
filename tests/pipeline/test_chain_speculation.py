"""N-gram speculation over a 3-segment chain on 127.0.0.1: one round trip verifies a draft.

Node a (layers 0-1) coordinates with speculation on (the default) and debug logs; node d holds
nothing and coordinates the same chain with `speculative_max_draft = 0`. Both must give
llama.cpp's greedy text for the whole file, a's with drafts accepted, and leave no KV session
behind (a rejected draft's rows are rewound, not leaked)."""

from __future__ import annotations

import re

import pytest

from tests.pipeline.swarm import (
    chain3_and_a_coordinator,
    chat,
    llama_greedy,
    run,
    split_model,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

# the random model's greedy reply soon repeats itself: drafts copy it
PROMPT = "say it again and again"


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("chainspec")
    model = split_model(base)
    with chain3_and_a_coordinator(base, model, "[inference]\nspeculative_max_draft = 0\n", d_extra=["-vv"]) as swarm:
        yield {"model": model, **swarm}


def _speculation_lines(proc) -> list[dict[str, float]]:
    lines = [ln for ln in proc.node_log().splitlines() if "DIAG: pipeline n-gram speculation complete" in ln]
    return [{k: float(v) for k, v in re.findall(r"(rounds|drafted|accepted|paused_rounds|tokens_per_round)=([\d.]+)", ln)}
            for ln in lines]


def test_speculating_chain_gives_llama_cpps_greedy_text_with_drafts_accepted(swarm):
    a, _, _, d = swarm["nodes"]
    expected = llama_greedy(swarm["model"], PROMPT, 64)

    async def go():
        for stream in (False, True):
            status, headers, on = await chat(a, swarm["model_id"], PROMPT, max_tokens=64, stream=stream)
            assert status == 200, on
            assert headers["x-swarm-route"] == "distributed" and headers["x-swarm-segments"] == "3"
            status, headers, off = await chat(d, swarm["model_id"], PROMPT, max_tokens=64, stream=stream)
            assert status == 200, off
            assert headers["x-swarm-segments"] == "3"
            assert on == off == expected
    run(go())
    stats = _speculation_lines(a)
    assert len(stats) == 2, a.node_log()[-3000:]
    for s in stats:
        assert s["accepted"] > 0 and s["accepted"] <= s["drafted"]
        assert s["tokens_per_round"] > 1.5, s  # the reply repeats: rounds carry several tokens
    assert not _speculation_lines(d)  # off there: one token per round trip


def test_max_tokens_inside_a_verified_draft_is_honoured(swarm):
    a = swarm["nodes"][0]
    full = llama_greedy(swarm["model"], PROMPT, 64)
    expected = {n: llama_greedy(swarm["model"], PROMPT, n) for n in (3, 13, 29)}  # not on the loop: it blocks

    async def go():
        for n in (3, 13, 29):
            status, _, text = await chat(a, swarm["model_id"], PROMPT, max_tokens=n)
            assert status == 200, text
            assert text == expected[n]
            assert full.startswith(text)
    run(go())


def test_no_kv_session_left_after_speculating_requests(swarm):
    run(chat(swarm["nodes"][0], swarm["model_id"], PROMPT, max_tokens=40))

    async def idle():
        for p in swarm["nodes"][:3]:
            stats = await p.async_get_json("/api/admin/stats")
            if stats["kv_sessions"] != 0:
                return False
        return True
    run(wait_until(idle, 30, 0.1, "every segment to free its KV sessions"))
