"""N-gram speculation (node.inference.speculate): the drafter, and the batch engine's verify step on
real GGUF files — the same tokens with and without it (greedy and seeded), drafts really accepted."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.inference.handoff import GenerationJob
from node.inference.llama_engine import LlamaEngine
from node.inference.sampling import SamplingParams
from node.inference.speculate import MAX_PAUSE_ROUNDS, NgramDrafter, accept_count, speculation_off_reason
from tests.inference.test_batching import GREEDY, PENALISED, SEEDED, model, run, together  # noqa: F401 (fixture)

# --- the drafter ---------------------------------------------------------------------------


def test_the_longest_ngram_ending_the_context_gives_the_draft():
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3], max_k=3)
    assert d.lookup(3) == [4, 5, 9]  # the 3-gram "1 2 3" (before 4) wins over "2 3" (before 7)
    d = NgramDrafter([2, 3, 7, 9, 2, 3, 8, 1, 2, 3], max_k=3)
    assert d.lookup(3) == [8, 1, 2]  # only "2 3" recurs: its latest earlier occurrence counts
    d = NgramDrafter([1, 2, 3, 4, 5, 6, 1, 2, 3], max_k=8, max_n=3)
    assert d.lookup(8) == [4, 5, 6, 1, 2, 3, 4, 5]  # the 3-gram wins; the copy runs on over itself
    assert NgramDrafter([7, 7, 7, 7], max_k=4).lookup(4) == [7, 7, 7, 7]  # a loop drafts k tokens
    assert NgramDrafter([1, 2, 1, 2, 1], max_k=5).lookup(5) == [2, 1, 2, 1, 2]
    assert NgramDrafter([1, 2, 3], max_k=4).lookup(4) == []  # nothing occurred twice


def test_k_grows_on_acceptance_and_misses_pause_drafting_with_a_doubling_backoff():
    d = NgramDrafter([5, 6, 5, 6, 5, 6, 5], max_k=8)
    k0 = d.k
    draft = d.draft()
    assert draft and len(draft) <= k0
    d.observe(len(draft), len(draft))
    assert d.k == min(8, 2 * max(k0, len(draft)))
    pauses = []
    for _ in range(6):
        draft = d.draft()
        while not draft:  # paused rounds
            draft = d.draft()
        d.observe(len(draft), 0)
        pauses.append(d._pause)
    assert pauses == [1, 2, 4, 8, 16, 16][:len(pauses)] and max(pauses) <= MAX_PAUSE_ROUNDS
    assert d.stats.paused_rounds == sum(pauses[:-1])
    assert d.stats.tokens_per_round == (d.stats.rounds + d.stats.accepted) / d.stats.rounds


def test_accept_count_and_what_turns_speculation_off():
    assert accept_count([1, 2, 3], [1, 2, 9, 4]) == 2
    assert accept_count([1, 2], [1, 2, 3]) == 2
    assert accept_count([4], [5, 4]) == 0
    assert speculation_off_reason(SamplingParams(temperature=0.0)) is None
    assert speculation_off_reason(SamplingParams(temperature=0.8, seed=1)) == "sampling"
    assert speculation_off_reason(SamplingParams(temperature=0.0, logit_bias={1: -5.0})) == "logit_bias"
    assert speculation_off_reason(SamplingParams(temperature=0.0, logprobs=2)) == "logprobs"


# --- the engine ------------------------------------------------------------------------------

REPEAT = ("def area(width, height):\n    return width * height\n\n"
          "Rewrite it with the name size instead of area:\n\ndef size(width, height):\n")


@pytest.fixture
async def engines():
    made: list[LlamaEngine] = []

    async def make(path, draft: int, max_concurrent: int = 8) -> LlamaEngine:
        engine = LlamaEngine("m", path, n_ctx=256, n_threads=1, max_concurrent=max_concurrent,
                             speculative_max_draft=draft)
        made.append(engine)
        await engine.async_run(engine.load)
        return engine
    yield make
    loop = asyncio.get_running_loop()
    for engine in made:
        await engine.async_run(engine.close)
        await loop.run_in_executor(None, lambda e=engine: e.executor.shutdown(wait=True))


def prompts_of(model) -> list[list[int]]:  # noqa: F811 - the fixture's value
    repeat = model.tok.tokenize(REPEAT)
    return [repeat, repeat[:-3] + repeat[:12]] + model.prompts[:6]


@pytest.mark.parametrize("params", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalised"])
async def test_speculation_gives_the_same_tokens_alone_and_in_a_batch(model, params, engines, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG, logger="node.inference.batch_engine")
    prompts = prompts_of(model)
    plain = await engines(model.path, 0)
    expected = [await run(plain, model.tok, p, params, max_new=48) for p in prompts]
    spec = await engines(model.path, 8)
    alone = [await run(spec, model.tok, p, params, max_new=48) for p in prompts]
    assert alone == expected
    if params is GREEDY:
        assert spec.batcher.spec_drafted > 0 and spec.batcher.spec_accepted > 0  # drafts verified and kept
    else:  # sampled requests do not speculate (speculation_off_reason)
        assert spec.batcher.spec_drafted == 0
    batched_engine = await engines(model.path, 8)
    batched = await together(batched_engine, (run(batched_engine, model.tok, p, params, max_new=48) for p in prompts))
    assert batched_engine.batcher.max_active_seen == len(prompts)
    assert batched == expected
    lines = [r.getMessage() for r in caplog.records if "local n-gram speculation complete" in r.getMessage()]
    off = [r.getMessage() for r in caplog.records if "n-gram speculation off" in r.getMessage()]
    if params is GREEDY:  # one summary line per speculating request
        assert len(lines) == 2 * len(prompts) and not off
        assert all("tokens_per_round=" in line and "paused_rounds=" in line for line in lines)
    else:
        assert not lines and len(off) == 2 * len(prompts) and all("reason=sampling" in m for m in off)


async def test_a_cancel_mid_speculation_frees_the_sequence_and_the_kv_matches_its_tokens(model, engines):  # noqa: F811
    spec = await engines(model.path, 8)
    prompt = prompts_of(model)[0]
    full = await run(spec, model.tok, prompt, GREEDY, max_new=48)
    job = GenerationJob("victim", list(prompt), GREEDY, 48)
    cut = await run(spec, model.tok, prompt, GREEDY, max_new=48, job=job, cancel_after=5)
    assert len(cut) == 5 < len(full) and cut == full[:5]
    again = await run(spec, model.tok, prompt, GREEDY, max_new=48)
    assert again == full
    kv = spec.batcher.kv_tokens()
    for slot in spec.batcher.slots:  # what the KV holds is what each slot says it holds
        assert kv[slot.seq_id] == len(slot.tokens)
