"""The batch engine (node.inference.batch_engine) through LlamaEngine, on real GGUF files: the same
text alone and in a batch of 8, cancel, prefix reuse, the KV budget under many conversations."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import pytest

from node.inference.handoff import GenerationJob, TokenChannel, batch_scores
from node.inference.llama_engine import LlamaEngine
from node.inference.sampling import SamplingParams
from node.inference.synth import SynthSpec
from node.inference.tokenizer import ModelTokenizer
from node.resources import default_model_path
from tests.support.nodes import tiny_model
from tests.support.waiting import wait_until

RANDOM = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256, qtype="Q8_0",
                   name="batch")
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, seed=1234)
PENALISED = SamplingParams(temperature=0.7, seed=99, repeat_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5)
QUESTIONS = ["What does len() return?", "How do I open a file?", "Explain list.append.", "What is a dict?",
             "How does range work?", "What is None?", "Describe str.split.", "What does zip do?"]

needs_default = pytest.mark.skipif(not default_model_path().exists(), reason="the default model is not in resources/")


@dataclass
class Model:
    path: object
    tok: ModelTokenizer
    prompts: list[list[int]]


@pytest.fixture(scope="module", params=["default", "random"])
def model(request, tmp_path_factory):
    if request.param == "default":
        if not default_model_path().exists():
            pytest.skip("the default model is not in resources/")
        path = default_model_path()
    else:
        path = tiny_model(tmp_path_factory.mktemp("batch"), RANDOM, "batch.gguf")
    tok = ModelTokenizer(path)
    try:
        if request.param == "default":
            prompts = [tok.chat_tokens([{"role": "user", "content": q}]) for q in QUESTIONS]
        else:
            prompts = [tok.tokenize(q) for q in QUESTIONS]
        yield Model(path, tok, prompts)
    finally:
        tok.close()


@pytest.fixture
async def engine_factory():
    made: list[LlamaEngine] = []

    async def make(path, max_concurrent=8, kv_cache_seqs=0, n_ctx=256) -> LlamaEngine:
        engine = LlamaEngine("m", path, n_ctx=n_ctx, n_threads=1, max_concurrent=max_concurrent,
                             kv_cache_seqs=kv_cache_seqs)
        made.append(engine)
        await engine.async_run(engine.load)
        return engine
    yield make
    loop = asyncio.get_running_loop()
    for engine in made:
        await engine.async_run(engine.close)
        await loop.run_in_executor(None, lambda e=engine: e.executor.shutdown(wait=True))


async def run(engine: LlamaEngine, tok: ModelTokenizer, prompt: list[int], params: SamplingParams,
              max_new: int = 24, job: GenerationJob | None = None, on_tokens=None, on_batch=None,
              cancel_after: int | None = None) -> list[int]:
    """One generation through the batch; its token ids (the end-of-generation token included).
    `cancel_after`: the job is cancelled as its n-th token is handed over, on the engine's thread
    (as a client gone at that moment; a tiny model's steps outrun any loop-side reaction)."""
    job = job or GenerationJob("r", list(prompt), params, max_new)
    channel = TokenChannel(asyncio.get_running_loop())
    if cancel_after is not None:
        put, handed = channel.put, []

        def put_then_cancel(item, scores=None):
            put(item, scores)
            handed.append(item)
            if len(handed) == cancel_after:
                job.cancel.set()
        channel.put = put_then_cancel
    done = engine.async_generate(job, channel, tok.is_eog, tok)
    out: list[int] = []
    task = asyncio.ensure_future(done)
    async for batch in channel.batches():
        out += batch
        if on_batch is not None:
            on_batch(batch)
        if on_tokens is not None:
            on_tokens(out)
    await task
    return out


async def together(engine: LlamaEngine, runs) -> list[list[int]]:
    """Run the coroutines with the engine's thread held until every one has joined the queue, so
    the first step admits them all (a tiny model would finish the first before the last arrives)."""
    # the last batch loop may still be on the thread after its requests ended: it would admit
    # these as they come, one by one (a loaded machine's CI run timed out waiting for all of them)
    await wait_until(lambda: not engine.batcher._running, 10, 0.01, "the last batch loop to end")
    gate = threading.Event()
    held = engine.executor.submit(gate.wait, 30)
    tasks = [asyncio.ensure_future(r) for r in runs]
    try:
        await wait_until(lambda: len(engine.batcher._pending) == len(tasks), 10, 0.01, "every request queued")
    finally:
        gate.set()
    await asyncio.wrap_future(held)
    return list(await asyncio.gather(*tasks))


@pytest.mark.parametrize("params", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalised"])
async def test_the_same_text_alone_and_in_a_batch_of_8(model, params, engine_factory):
    alone_engine = await engine_factory(model.path)
    alone = [await run(alone_engine, model.tok, p, params) for p in model.prompts]
    assert alone_engine.batcher.max_active_seen == 1
    batch_engine = await engine_factory(model.path)
    batched = await together(batch_engine, (run(batch_engine, model.tok, p, params) for p in model.prompts))
    assert batch_engine.batcher.max_active_seen == 8  # they really decoded together
    assert [len(t) for t in alone] == [len(t) for t in batched]
    assert batched == alone
    assert len({tuple(t) for t in alone}) > 1  # different prompts, different replies: not a constant


async def test_a_cancelled_request_frees_its_sequence_and_the_others_are_unchanged(model, engine_factory, caplog):
    caplog.set_level(logging.DEBUG, logger="node.inference.batch_engine")
    caplog.set_level(logging.DEBUG, logger="node.inference.kv_slots")
    reference = await engine_factory(model.path)
    alone = [await run(reference, model.tok, p, GREEDY, max_new=32) for p in model.prompts]
    engine = await engine_factory(model.path)
    victim = GenerationJob("victim", list(model.prompts[3]), GREEDY, 32)
    results = await together(engine, (
        run(engine, model.tok, p, GREEDY, max_new=32, job=victim if i == 3 else None,
            cancel_after=3 if i == 3 else None)
        for i, p in enumerate(model.prompts)))
    assert engine.batcher.max_active_seen == 8
    assert len(results[3]) == 3 < len(alone[3])
    assert results[3] == alone[3][:len(results[3])]
    assert [r for i, r in enumerate(results) if i != 3] == [a for i, a in enumerate(alone) if i != 3]
    freed = [r.getMessage() for r in caplog.records if "KV-cache sequence freed" in r.getMessage()]
    assert len(freed) == 1 and "request_id=victim" in freed[0] and "reason=cancelled" in freed[0]
    # its cells are gone from llama.cpp's KV (another sequence may since have moved onto its id),
    # the seven others stay cached, and what llama.cpp holds is what every slot says it holds
    kv = engine.batcher.kv_tokens()
    assert all(kv[s.seq_id] == len(s.tokens) for s in engine.batcher.slots)
    held = [s.tokens for s in engine.batcher.slots if s.tokens]
    victim_prompt = list(model.prompts[3])
    assert len(held) == 7 and not any(t[:len(victim_prompt)] == victim_prompt for t in held)


class DecodeSpy:
    """llama-cpp-python's low-level module with llama_decode recorded: the seq id of every row."""

    def __init__(self, ll):
        self._ll = ll
        self.batches: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self._ll, name)

    def llama_decode(self, ctx, batch):
        self.batches.append([batch.seq_id[i][0] for i in range(batch.n_tokens)])
        return self._ll.llama_decode(ctx, batch)


async def test_running_sequences_decode_on_consecutive_ids_and_moving_them_changes_no_text(model, engine_factory):
    """llama.cpp computes per-sequence KV streams in one pass only over consecutive ids in
    increasing order. 12 requests of different lengths through 4 running + 4 cached sequences
    leave holes as they end; every batch still lists consecutive ids in order (sequences were
    moved to get there), the texts are the texts alone, and a second turn still hits its moved
    prefix and gives the text it gives on an engine that ran alone."""
    prompts = [model.prompts[i % 8][:-1] + model.prompts[(i + 3) % 8][-1:] if i >= 8 else model.prompts[i]
               for i in range(12)]
    lengths = [6 + (7 * i) % 23 for i in range(12)]
    alone_engine = await engine_factory(model.path, max_concurrent=1, kv_cache_seqs=8)
    alone = [await run(alone_engine, model.tok, p, GREEDY, max_new=n) for p, n in zip(prompts, lengths, strict=True)]
    engine = await engine_factory(model.path, max_concurrent=4, kv_cache_seqs=4)
    b = engine.batcher
    spy = b.ll = DecodeSpy(b.ll)
    batched = await together(engine, (run(engine, model.tok, p, GREEDY, max_new=n)
                                      for p, n in zip(prompts, lengths, strict=True)))
    assert b.max_active_seen == 4 and b.kv_slots.moves > 0  # holes appeared and were closed
    assert batched == alone
    multi = [rows for rows in spy.batches if len(set(rows)) > 1]
    assert len(multi) > 10
    for rows in multi:
        ids = sorted(set(rows))
        assert rows == sorted(rows) and ids == list(range(ids[0], ids[0] + len(ids))), rows
    kv = b.kv_tokens()
    assert all(kv[s.seq_id] == len(s.tokens) for s in b.slots)  # every move took its KV along
    # the four last conversations are cached (wherever they were moved): their next turns hit
    turn2 = [prompts[i] + alone[i][:-1] + model.prompts[0][-1:] for i in range(8, 12)]
    jobs = [GenerationJob(f"t2-{i}", t, GREEDY, 12) for i, t in enumerate(turn2)]
    second = await together(engine, (run(engine, model.tok, t, GREEDY, job=j) for t, j in zip(turn2, jobs, strict=True)))
    hits = [j.cached_tokens for j in jobs]
    assert sum(1 for n in hits if n > 0) >= 3, hits
    reference = [await run(alone_engine, model.tok, t, GREEDY, max_new=12) for t in turn2]
    assert second == reference


async def test_a_prefix_hit_gives_the_same_text_as_a_miss(model, engine_factory, caplog):
    caplog.set_level(logging.DEBUG, logger="node.inference.batch_engine")
    caplog.set_level(logging.DEBUG, logger="node.inference.kv_slots")
    warm = await engine_factory(model.path, max_concurrent=2, kv_cache_seqs=2)
    first = model.prompts[0]
    reply = await run(warm, model.tok, first, GREEDY)
    turn2 = first + reply[:-1] + model.prompts[1][1:]  # the conversation goes on (without the end token)
    hit_job = GenerationJob("turn2", turn2, GREEDY, 24)
    hit = await run(warm, model.tok, turn2, GREEDY, job=hit_job)
    assert hit_job.cached_tokens >= len(first)
    hits = [r.getMessage() for r in caplog.records if "KV-cache HIT" in r.getMessage()]
    assert any(f"start_pos={hit_job.cached_tokens} cached_tokens={hit_job.cached_tokens}" in h for h in hits)
    cold = await engine_factory(model.path, max_concurrent=2, kv_cache_seqs=2)
    scored = SamplingParams(temperature=0.0, logprobs=2)  # greedy, with the two best tokens of each step
    miss_job = GenerationJob("cold", turn2, scored, 24)
    scores: list = []
    miss = await run(cold, model.tok, turn2, scored, job=miss_job,
                     on_batch=lambda batch: scores.extend(batch_scores(batch) or ()))
    assert miss_job.cached_tokens == 0
    assert any("KV-cache MISS" in r.getMessage() and "request_id=cold" in r.getMessage() for r in caplog.records)
    # The cached prefix's KV was computed token by token while the first reply decoded, the cold
    # one in one prefill batch: llama.cpp's kernels round the two differently (~1e-3), so the texts
    # are equal, or part where the cold run's two best tokens were a tie (logprobs 0.05 apart).
    for i, (a, b) in enumerate(zip(hit, miss, strict=False)):
        if a != b:
            top = scores[i]
            assert a in top.top_ids and abs(top.top_logprobs[0] - top.top_logprobs[1]) < 0.05, (i, top)
            break
    else:
        assert len(hit) == len(miss)


async def test_the_kv_stays_within_its_budget_under_many_conversations(tmp_path, engine_factory, caplog):
    """12 conversations of 2 turns on 2 running + 2 cached sequences (and the spare, always empty):
    the KV never holds more than 4 sequences of at most n_ctx tokens, the least recently used are evicted (logged), and a
    conversation whose sequence is still cached hits."""
    caplog.set_level(logging.DEBUG, logger="node.inference.batch_engine")
    caplog.set_level(logging.DEBUG, logger="node.inference.kv_slots")
    path = tiny_model(tmp_path, RANDOM, "batch.gguf")
    tok = ModelTokenizer(path)
    try:
        engine = await engine_factory(path, max_concurrent=2, kv_cache_seqs=2, n_ctx=128)
        b = engine.batcher
        assert b.n_slots == 5 and b.kv_slots.capacity == 4
        history: dict[int, list[int]] = {}
        for turn in range(2):
            order = range(12) if turn == 0 else reversed(range(12))  # turn 2: the most recent first
            for rank, c in enumerate(order):
                before = history.get(c, [])
                prompt = before + tok.tokenize(f"conversation {c} turn {turn}: the data model")
                job = GenerationJob(f"c{c}t{turn}", prompt, GREEDY, 8)
                reply = await run(engine, tok, prompt, GREEDY, job=job)
                history[c] = prompt + reply
                kv = b.kv_tokens()
                assert len(kv) == 5 and all(0 <= n <= 128 for n in kv.values())
                assert sum(1 for n in kv.values() if n) <= 4
                if turn == 1 and rank < 4:  # still cached: its first turn is reused, all but the reply's
                    # last token (sampled, never decoded into the KV)
                    assert job.cached_tokens == len(before) - 1, (c, job.cached_tokens, len(before))
        evicted = [r for r in caplog.records if "KV-cache sequence evicted" in r.getMessage()]
        assert len(evicted) == b.kv_slots.evictions == 8 + 8  # every first turn after the 4th, every older second turn
        assert all("reason=lru" in r.getMessage() for r in evicted)
        # a full cache evicts once per request: DEBUG, not an INFO line per request (2026-12-07)
        assert {r.levelno for r in evicted} == {logging.DEBUG}
    finally:
        tok.close()


async def test_model_slots_admit_up_to_the_limit_first_come_first_served_and_unload_waits_for_all():
    from node.inference.model_slots import ModelSlots

    slots = ModelSlots(2)
    await slots.acquire()
    await slots.acquire()
    assert slots.locked() and slots.holders == 2
    order: list[str] = []

    async def request(name: str) -> None:
        await slots.acquire()
        order.append(name)

    async def unload() -> None:
        async with slots.exclusive():
            order.append("unload")
            assert slots.holders == 0
    third = asyncio.ensure_future(request("third"))
    gone = asyncio.ensure_future(request("gone"))
    excl = asyncio.ensure_future(unload())
    fourth = asyncio.ensure_future(request("fourth"))
    await wait_until(lambda: len(slots._waiters) == 4, 5, 0.01, "four waiters")
    gone.cancel()  # a client that leaves the queue takes no slot
    slots.release()
    await wait_until(lambda: order == ["third"], 5, 0.01, "the first waiter served")
    assert not excl.done()  # the unload waits for every holder
    slots.release()
    slots.release()  # third's
    await wait_until(lambda: fourth.done(), 5, 0.01, "the unload, then the next request")
    assert order == ["third", "unload", "fourth"] and slots.holders == 1 and gone.cancelled() and third.done()
    slots.release()
    assert not slots.locked() and slots.holders == 0


@needs_default
async def test_a_new_conversation_with_a_cached_system_prompt_starts_from_a_copy(engine_factory, caplog):
    """Conversation B shares A's system prompt but not its question: B starts from a copy of A's
    KV (cut after the shared part), gives the text it gives cold, and A stays cached whole."""
    caplog.set_level(logging.DEBUG, logger="node.inference.batch_engine")
    caplog.set_level(logging.DEBUG, logger="node.inference.kv_slots")
    path = default_model_path()
    tok = ModelTokenizer(path)
    try:
        system = {"role": "system", "content": "You answer questions about the Python standard library briefly, "
                                               "with one example, and nothing else."}
        a = tok.chat_tokens([system, {"role": "user", "content": "What does os.listdir do?"}])
        b = tok.chat_tokens([system, {"role": "user", "content": "Explain json.dumps."}])
        shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        assert shared >= 16
        engine = await engine_factory(path, max_concurrent=2, kv_cache_seqs=2)
        long_reply = SamplingParams(temperature=0.0, logit_bias=tuple((i, -100.0) for i in range(tok.n_vocab)
                                                                      if tok.is_eog(i)))
        await run(engine, tok, a, long_reply, max_new=64)
        cached_a = next(list(s.tokens) for s in engine.batcher.slots if s.tokens)
        assert shared * 2 < len(cached_a)  # B does not continue A: A is not cut, it is copied
        job = GenerationJob("b", b, GREEDY, 24)
        warm = await run(engine, tok, b, GREEDY, job=job)
        assert job.cached_tokens == shared
        assert any("request_id=b" in r.getMessage() and "copied_from=" in r.getMessage() for r in caplog.records)
        assert any(s.tokens == cached_a for s in engine.batcher.slots)  # A's whole sequence is still there
        cold = await engine_factory(path, max_concurrent=2, kv_cache_seqs=2)
        assert await run(cold, tok, b, GREEDY, max_new=24) == warm
    finally:
        tok.close()
