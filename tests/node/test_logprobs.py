"""logprobs / top_logprobs with the official `openai` client against real nodes on 127.0.0.1.

Local route: the embedded default model (llama.cpp), chat and completions, streaming and not; the
chosen token's logprob equals what llama-cpp-python itself reports (`Llama(logits_all=True)`,
`create_completion(logprobs=n)`) on the same file and prompt. The distributed route's logprobs:
tests/pipeline/test_distributed_logprobs.py.
"""

from __future__ import annotations

import openai
import pytest
import pytest_asyncio

from node.inference.llamacpp import load as load_llama_cpp
from node.inference.tokenizer import ModelTokenizer
from node.resources import default_model_path
from tests.support.logprobs import chat_entries, check_entry
from tests.support.nodes import default_model_node, node_config, openai_client, running_node

pytestmark = [pytest.mark.llama]
needs_default = pytest.mark.skipif(not default_model_path().exists(),
                                   reason="the embedded default model is not in this checkout")

QUESTION = "What does os.path.join do?"
PROMPT = "def read_config(path):\n    "
N = 24  # tokens generated per request
# llama.cpp's logits for the same tokens, the same context settings: equal to float rounding
LOCAL_TOL = 1e-3


def chat_messages(content: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.fixture(scope="module")
def reference():
    """llama-cpp-python's own greedy completions with logprobs=5 (logits_all=True) for our chat
    prompt's token ids and for PROMPT's, with the context the node gives the model."""
    return llama_reference(flash_attn=False)


@pytest.fixture(scope="module")
def reference_fa():
    """The same with flash attention on (`Llama(flash_attn=True)`)."""
    return llama_reference(flash_attn=True)


def llama_reference(flash_attn: bool) -> dict:
    path = default_model_path()
    tok = ModelTokenizer(path)
    try:
        chat_ids = tok.chat_tokens(chat_messages())
        text_ids = tok.tokenize(PROMPT)
    finally:
        tok.close()
    llm = load_llama_cpp().Llama(model_path=str(path), n_ctx=256, n_threads=1, logits_all=True, verbose=False,
                                 flash_attn=flash_attn)
    try:
        out = {}
        for name, ids in (("chat", chat_ids), ("text", text_ids)):
            reply = llm.create_completion(ids, max_tokens=N, temperature=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                          repeat_penalty=1.0, logprobs=5)
            out[name] = {**reply["choices"][0]["logprobs"], "prompt_len": len(ids)}
    finally:
        llm.close()
    return out


node = default_model_node("logprobs")
fa_node = default_model_node("logprobs-fa", flash_attention=True)


@pytest.fixture
def fa_client(fa_node):
    return openai_client(fa_node)


# --- the parts: scores in numpy and torch, on the wire ------------------------------------------


def test_numpy_and_torch_scores_agree_and_are_a_log_softmax():
    import numpy as np
    import torch

    from node.inference.logprobs import scores_from_logits
    from node.inference.pipeline.sampler import Sampler
    from node.inference.sampling import SamplingParams

    row = np.random.default_rng(3).normal(0, 4, 300).astype(np.float32)
    want = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    ours = scores_from_logits(row, 7, 5)
    torch_ = Sampler(SamplingParams(temperature=0, logprobs=5)).scores(torch.from_numpy(row), 7)
    best = list(np.argsort(-row)[:5])
    for s in (ours, torch_):
        assert abs(s.logprob - want[7]) <= 1e-5
        assert list(s.top_ids) == best
        assert s.top_logprobs == pytest.approx(want[best], abs=1e-5)
    assert scores_from_logits(row, 7, 0).top_ids == ()
    assert Sampler(SamplingParams(temperature=0)).scores(torch.from_numpy(row), 7) is None  # off: nothing


def test_result_and_tokens_carry_scores_only_when_asked():
    from node.errors import ProtocolError
    from node.inference.handoff import TokenScores
    from node.inference.pipeline.remote_wire import Tokens
    from node.inference.pipeline.wire import Result

    plain = Result("s/1", 3, token=9)
    assert "logprobs" not in plain.to_header() and Result.from_header(plain.to_header()).scores is None
    scored = Result("s/1", 3, token=9, scores=TokenScores(-0.5, (9, 4), (-0.5, -1.25)))
    assert Result.from_header(scored.to_header()) == scored
    with pytest.raises(ProtocolError):
        Result.from_header({**scored.to_header(), "logprobs": {"lp": -1, "ids": [1, 2], "top": [-1]}})

    msg = Tokens("s/1", 0, (5, 6), scores=(TokenScores(-0.25, (5, 1), (-0.25, -2.0)),
                                            TokenScores(-1.5, (2, 6), (-0.75, -1.5))))
    back = Tokens.from_frame(msg.to_header(), msg.payload())
    assert back.tokens == (5, 6) and back.scores == msg.scores  # these values are exact in float32
    plain_tokens = Tokens("s/1", 0, (5, 6))
    assert "lp" not in plain_tokens.to_header() and len(plain_tokens.payload()) == 8
    assert Tokens.from_frame(plain_tokens.to_header(), plain_tokens.payload()).scores == ()
    with pytest.raises(ProtocolError):
        Tokens.from_frame(msg.to_header(), msg.payload()[:-4])
    with pytest.raises(ProtocolError):
        Tokens.from_frame({**msg.to_header(), "lp": 21}, msg.payload())


# --- alignment with the text, on a tiny model whose engine is scripted ----------------------------
# (as tests/node/test_finish_reasons.py: the tokenizer, text assembly and API are real, the token
# ids and their scores are the test's: a byte-fallback token per byte, so UTF-8 splits are exact)

EOS = 2


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def tiny_node(tmp_path_factory):
    from tests.support.nodes import tiny_model

    base = tmp_path_factory.mktemp("logprobs_tiny")
    async with running_node(node_config(base / "data", tiny_model(base))) as n:
        yield n


@pytest.fixture
def scripted(tiny_node, monkeypatch):
    """The model emits `text`'s bytes as byte tokens then EOS; token i has logprob -(i+1)/10 (and
    itself as its one top token) unless `scores` is False."""
    from node.inference.handoff import TokenScores

    served = tiny_node.models.all()[0]

    def set_text(text: str, scores: bool = True):
        tokens = [3 + b for b in text.encode()] + [EOS]

        def generate(job, channel, is_eog, vocab=None):
            for i, tok in enumerate(tokens[:job.max_new_tokens]):
                channel.put(tok, TokenScores(-(i + 1) / 10, (tok,), (-(i + 1) / 10,)) if scores else None)
            channel.close()
        monkeypatch.setattr(served.engine, "submit",  # in place of the batch: this script, on the engine's thread
                            lambda *args: served.engine.executor.submit(generate, *args))
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{tiny_node.api.port}/v1", api_key=tiny_node.api_key,
                                max_retries=0)
    return set_text, client


@pytest.mark.asyncio(loop_scope="module")
async def test_a_character_split_over_tokens_goes_out_with_all_its_tokens(scripted):
    set_text, client = scripted
    set_text("aé🚀b")
    stream = await client.chat.completions.create(model="tiny", messages=chat_messages(), max_tokens=40,
                                                  logprobs=True, top_logprobs=1, stream=True)
    reported = []
    async for chunk in stream:
        if not chunk.choices or chunk.choices[0].delta.content is None:
            continue
        content, lp = chunk.choices[0].delta.content, chunk.choices[0].logprobs
        if content:
            assert b"".join(bytes(e.bytes) for e in lp.content) == content.encode(), content
            reported += lp.content
    assert [round(e.logprob, 6) for e in reported] == [-(i + 1) / 10 for i in range(len("aé🚀b".encode()))]
    assert [e.top_logprobs[0].token for e in reported] == [e.token for e in reported]


@pytest.mark.asyncio(loop_scope="module")
async def test_held_back_text_reports_its_tokens_when_it_goes_out(scripted):
    set_text, client = scripted
    set_text("abcXYd")  # "XY" might start the stop sequence "XYZ": held back, then sent with "d"
    reply = await client.completions.create(model="tiny", prompt="p", max_tokens=40, logprobs=0, stop=["XYZ"])
    lp = reply.choices[0].logprobs
    assert reply.choices[0].text == "abcXYd" == "".join(lp.tokens)
    assert lp.text_offset == [1 + i for i in range(6)]
    stream = await client.completions.create(model="tiny", prompt="p", max_tokens=40, logprobs=0, stop=["XYZ"],
                                             stream=True)
    chunks = [(c.choices[0].text, c.choices[0].logprobs.tokens if c.choices[0].logprobs else None)
              async for c in stream]
    assert ("XYd", ["X", "Y", "d"]) in chunks


@pytest.mark.asyncio(loop_scope="module")
async def test_an_engine_without_logprobs_fails_the_request_rather_than_drop_them(scripted):
    set_text, client = scripted
    set_text("abc", scores=False)
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(model="tiny", messages=chat_messages(), max_tokens=4, logprobs=True)
    assert caught.value.body["code"] == "engine_error"


# --- local route --------------------------------------------------------------------------------


@needs_default
@pytest.mark.asyncio(loop_scope="module")
async def test_chat_logprobs_equal_llama_cpps_and_describe_the_reply(client, model_id, reference):
    reply = await client.chat.completions.create(model=model_id, messages=chat_messages(), max_tokens=N,
                                                 temperature=0, logprobs=True, top_logprobs=5)
    choice = reply.choices[0]
    entries = chat_entries(choice.logprobs)
    assert choice.logprobs.refusal is None
    assert len(entries) == reply.usage.completion_tokens > 0
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content
    for e in entries:
        check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 5)
        assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in e.top_logprobs)
    ref = reference["chat"]["token_logprobs"]
    n = min(len(ref), len(entries))
    assert n >= min(N, len(entries)) - 1  # llama-cpp-python also stops at the end of turn
    for i in range(n):
        assert abs(entries[i].logprob - ref[i]) <= LOCAL_TOL, (i, entries[i].logprob, ref[i])
        want = sorted(reference["chat"]["top_logprobs"][i].values(), reverse=True)[:5]
        assert [t.logprob for t in entries[i].top_logprobs] == pytest.approx(want, abs=LOCAL_TOL)


@needs_default
@pytest.mark.asyncio(loop_scope="module")
async def test_flash_attention_on_gives_llama_cpps_flash_attention_numbers(fa_node, fa_client, reference,
                                                                            reference_fa):
    """`flash_attention = true` reaches the llama.cpp context: the logprobs equal llama-cpp-python's
    with flash_attn=True, and differ from the default's (flash attention off) somewhere."""
    reply = await fa_client.chat.completions.create(
        model=fa_node.models.all()[0].id, messages=chat_messages(), max_tokens=N, temperature=0, logprobs=True,
        top_logprobs=5)
    entries = chat_entries(reply.choices[0].logprobs)
    ref_fa, ref_off = reference_fa["chat"]["token_logprobs"], reference["chat"]["token_logprobs"]
    n = min(len(ref_fa), len(ref_off), len(entries))
    assert n >= min(N, len(entries)) - 1
    assert all(abs(entries[i].logprob - ref_fa[i]) <= LOCAL_TOL for i in range(n)), \
        [(entries[i].logprob, ref_fa[i]) for i in range(n)]
    assert max(abs(entries[i].logprob - ref_off[i]) for i in range(n)) > LOCAL_TOL  # it did take effect


@needs_default
@pytest.mark.asyncio(loop_scope="module")
async def test_chat_streaming_chunks_carry_their_tokens_logprobs(client, model_id):
    whole = await client.chat.completions.create(model=model_id, messages=chat_messages(), max_tokens=N,
                                                 temperature=0, logprobs=True, top_logprobs=2)
    stream = await client.chat.completions.create(model=model_id, messages=chat_messages(), max_tokens=N,
                                                  temperature=0, logprobs=True, top_logprobs=2, stream=True,
                                                  stream_options={"include_usage": True})
    streamed, text, usage = [], "", None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content = choice.delta.content or ""
        text += content
        if choice.logprobs is not None:
            got = chat_entries(choice.logprobs)
            assert got, "a chunk with logprobs names at least one token"
            streamed.extend(got)
        elif content:
            raise AssertionError(f"a text chunk without its tokens' logprobs: {content!r}")
    assert text == whole.choices[0].message.content
    assert len(streamed) == usage.completion_tokens
    want = chat_entries(whole.choices[0].logprobs)
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in want]


@needs_default
@pytest.mark.asyncio(loop_scope="module")
async def test_completions_logprobs_shape_and_llama_cpps_numbers(client, model_id, reference):
    reply = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=N, temperature=0, logprobs=3)
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) \
        == reply.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    offsets = [len(PROMPT) + len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        check_entry(token, logprob, sorted(top.items(), key=lambda kv: -kv[1]), 3)
    ref = reference["text"]
    n = min(len(ref["token_logprobs"]), len(lp.tokens))
    assert n > 0
    assert lp.tokens[:n] == ref["tokens"][:n]
    for i in range(n):
        assert abs(lp.token_logprobs[i] - ref["token_logprobs"][i]) <= LOCAL_TOL
    # its prompt was token ids: its offsets count one a token before the completion's text
    assert [o - len(PROMPT) for o in lp.text_offset[:n]] == [o - ref["prompt_len"] for o in ref["text_offset"][:n]]

    stream = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=N, temperature=0,
                                             logprobs=3, stream=True)
    tokens, logprobs, offsets, text = [], [], [], ""
    async for chunk in stream:
        c = chunk.choices[0]
        text += c.text
        if c.logprobs is not None:
            tokens += c.logprobs.tokens
            logprobs += c.logprobs.token_logprobs
            offsets += c.logprobs.text_offset
            assert all(len(top) == 3 for top in c.logprobs.top_logprobs)
    assert text == choice.text
    assert (tokens, logprobs, offsets) == (lp.tokens, lp.token_logprobs, lp.text_offset)


@needs_default
@pytest.mark.asyncio(loop_scope="module")
async def test_top_logprobs_counts(client, model_id):
    for asked, want in ((None, 0), (0, 0), (1, 1), (20, 20)):
        extra = {} if asked is None else {"top_logprobs": asked}
        reply = await client.chat.completions.create(model=model_id, messages=chat_messages(), max_tokens=4,
                                                     temperature=0, logprobs=True, **extra)
        entries = chat_entries(reply.choices[0].logprobs)
        assert entries and all(len(e.top_logprobs) == want for e in entries), asked
    for asked in (0, 5):
        reply = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, temperature=0,
                                                logprobs=asked)
        assert all(len(top) == asked for top in reply.choices[0].logprobs.top_logprobs)
    off = await client.chat.completions.create(model=model_id, messages=chat_messages(), max_tokens=4, temperature=0)
    assert off.choices[0].logprobs is None
    off = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, temperature=0)
    assert off.choices[0].logprobs is None


@needs_default
@pytest.mark.asyncio(loop_scope="module")
async def test_a_stop_sequences_tokens_are_not_reported(client, model_id):
    free = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=N, temperature=0, logprobs=1)
    text = free.choices[0].text
    tokens = free.choices[0].logprobs.tokens
    # a token i (not the first two) whose text is at least 2 characters, from where the text is unique
    for i in range(2, len(tokens)):
        cut = len("".join(tokens[:i]))
        if len(tokens[i]) >= 2 and text.find(text[cut:cut + 6]) == cut and text.find(text[cut + 1:cut + 7]) == cut + 1:
            break
    else:
        raise AssertionError(f"no token to stop at in {text!r}")
    # the stop sequence starts with token i (it is not reported), or inside it (it is: its text
    # starts in the reply)
    for stop, reported_tokens in ((text[cut:cut + 6], tokens[:i]), (text[cut + 1:cut + 7], tokens[:i + 1])):
        for stream in (False, True):
            reply = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=N, temperature=0,
                                                    logprobs=1, stop=[stop], stream=stream)
            if stream:
                got, reported = "", []
                async for chunk in reply:
                    got += chunk.choices[0].text
                    if chunk.choices[0].logprobs is not None:
                        reported += chunk.choices[0].logprobs.tokens
            else:
                got, reported = reply.choices[0].text, reply.choices[0].logprobs.tokens
            assert got == text[:text.index(stop)]
            assert reported == reported_tokens, (stop, stream)


@needs_default
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("kind", "body", "param"), [
    ("chat", {"top_logprobs": 3}, "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ("chat", {"logprobs": "yes"}, "logprobs"),
    ("chat", {"logprobs": 1}, "logprobs"),
    ("text", {"logprobs": 6}, "logprobs"),
    ("text", {"logprobs": -1}, "logprobs"),
    ("text", {"logprobs": True}, "logprobs"),
    ("text", {"top_logprobs": 2}, "top_logprobs"),
])
async def test_bad_values_are_a_400_naming_the_parameter(client, model_id, kind, body, param):
    if kind == "chat":
        call = client.chat.completions.create(model=model_id, messages=chat_messages(), max_tokens=2, extra_body=body)
    else:
        call = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=2, extra_body=body)
    with pytest.raises(openai.BadRequestError) as caught:
        await call
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param
