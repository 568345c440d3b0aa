"""Output constraints and end-token options other servers take, on the default model through the
official openai SDK (`extra_body`), as SillyTavern, Home Assistant, vLLM clients and benchmark
tools send them (api/constraints.py):

- llama-server's `grammar` (GBNF) and vLLM's guided_json / guided_regex / guided_choice /
  guided_grammar and structured_outputs: the reply matches; each was a 400 (grammar) or an
  "unrecognized request argument" (vLLM's). A grammar llguidance's converter cannot read is a 400
  naming `grammar` with its reason; two constraints at once a 400 naming both.
- `ignore_eos` (vLLM's benchmark_serving, llmperf, genai-perf): exactly max_tokens tokens, finish
  "length", even where the model wants to end at once (its end token pushed by logit_bias); without
  max_tokens the reply ends at the context's room. vLLM's `min_tokens`: no end before that many.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "Is the sky blue?"}]

node = default_model_node("constraints")


@pytest.fixture
def eos_bias(node):
    """logit_bias that makes the model end at once (every end token pushed up)."""
    tok = node.models.all()[0].tokenizer
    return {str(i): 100 for i in range(tok.n_vocab) if tok.is_eog(i)}


async def chat(client, model_id, **extra):
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=60, temperature=0,
                                                 extra_body=extra)
    return reply.choices[0].message.content, reply.choices[0].finish_reason


async def test_gbnf_grammar_holds_the_reply(client, model_id):
    for temperature in (0, 1.5):
        reply = await client.chat.completions.create(
            model=model_id, messages=QUESTION, max_tokens=20, temperature=temperature, seed=7,
            extra_body={"grammar": 'root ::= answer\nanswer ::= "yes" | "no"'})
        assert reply.choices[0].message.content in ("yes", "no")
        assert reply.choices[0].finish_reason == "stop"
    text = await client.completions.create(model=model_id, prompt="Count:", max_tokens=30, temperature=0,
                                           extra_body={"grammar": 'root ::= [0-9]{2,4} " " [a-z]+ "."'})
    assert re.fullmatch(r"[0-9]{2,4} [a-z]+\.", text.choices[0].text), text.choices[0].text


async def test_vllm_guided_fields_and_structured_outputs(client, model_id):
    content, finish = await chat(client, model_id, guided_regex=r"[0-9]{3}-[a-z]{2}/x")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}/x", content) and finish == "stop"
    colours = ["red", "green", "light blue"]
    for extra in ({"guided_choice": colours}, {"structured_outputs": {"choice": colours}}):
        content, finish = await chat(client, model_id, **extra)
        assert content in colours and finish == "stop"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}}):
        content, _ = await chat(client, model_id, **extra)
        assert set(json.loads(content)) == {"ok"}
    for extra in ({"guided_grammar": 'root ::= "maybe" | "never"'},
                  {"structured_outputs": {"grammar": 'root ::= "maybe" | "never"', "disable_fallback": True}}):
        content, _ = await chat(client, model_id, **extra)
        assert content in ("maybe", "never")
    content, _ = await chat(client, model_id, structured_outputs={"json_object": True})
    assert isinstance(json.loads(content), dict)
    # SillyTavern's "no grammar" and a plain response_format text change nothing
    plain, _ = await chat(client, model_id)
    assert (await chat(client, model_id, grammar=""))[0] == plain
    content, _ = await chat(client, model_id, guided_choice=["a b"], response_format={"type": "text"})
    assert content == "a b"


@pytest.mark.parametrize(("extra", "param", "says"), [
    ({"grammar": "root ::= item\n"}, "grammar", "Rule 'item' not found"),
    ({"grammar": 'root = "x"'}, "grammar", "Expected ::="),
    ({"guided_regex": "[a-"}, "guided_regex", "cannot be compiled"),
    ({"guided_grammar": "root ::= " + '"a" ' * 20000}, "guided_grammar", "longer than"),
    ({"grammar": "root ::= " + "(" * 600 + '"a"' + ")" * 600}, "grammar", "nests too deeply"),  # (the fuzzer's)
    ({"guided_choice": ["a", ""]}, "guided_choice", "non-empty strings"),
    ({"guided_choice": ["x" * 2000] * 40}, "guided_choice", "characters in all"),  # (review r53)
    ({"guided_regex": "[^\\x00-\\x{10FFFF}]"}, "guided_regex", "the grammar admits no text"),
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice", "`guided_regex` and `guided_choice`"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar",
     "`response_format` or `grammar`"),
    ({"guided_regex": "a", "json_schema": {"type": "object"}}, "guided_regex", "`json_schema` or `guided_regex`"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not supported"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp", "unrecognized"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens", "must not exceed"),
], ids=lambda v: v if isinstance(v, str) else None)
async def test_bad_or_clashing_constraints_are_a_400_naming_them(client, model_id, extra, param, says):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4, extra_body=extra)
    assert info.value.body["param"] == param and says in info.value.body["message"], info.value.body


async def test_a_grammar_wider_than_its_parser_holds_is_a_400(client, model_id):
    """3,000 alternatives in one rule: llguidance's parser holds 2,000 items a row, and said so on the
    first token it consumed — a 500 "sampled outside the grammar" once (the fuzzer's find)."""
    body = dict(model=model_id, messages=QUESTION, max_tokens=4,
                extra_body={"grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(3000))})
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(**body)
    assert "cannot be followed" in info.value.body["message"] and "Current row has" in info.value.body["message"]
    stream = await client.chat.completions.create(**body, stream=True)  # the 200 is sent: an error event
    with pytest.raises(openai.APIError) as info:
        _ = [chunk async for chunk in stream]
    assert "cannot be followed" in info.value.message and "Current row has" in info.value.message, info.value


async def test_ignore_eos_gives_exactly_max_tokens(client, model_id, eos_bias):
    ended = await client.completions.create(model=model_id, prompt="Hello", max_tokens=16, temperature=0,
                                            logit_bias=eos_bias)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 16  # (what the test needs)
    for stream in (False, True):
        body = dict(model=model_id, prompt="Hello", max_tokens=16, temperature=0, logit_bias=eos_bias,
                    extra_body={"ignore_eos": True})
        if stream:
            chunks = [c async for c in await client.completions.create(
                **body, stream=True, stream_options={"include_usage": True})]
            usage, finish = chunks[-1].usage, [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            reply = await client.completions.create(**body)
            usage, finish = reply.usage, reply.choices[0].finish_reason
        assert usage.completion_tokens == 16 and finish == "length"
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0.8,
                                                 logit_bias=eos_bias, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 12 and reply.choices[0].finish_reason == "length"


async def test_min_tokens_holds_the_end_back(client, model_id, eos_bias):
    reply = await client.completions.create(model=model_id, prompt="Hello", max_tokens=16, temperature=0,
                                            logit_bias=eos_bias, extra_body={"min_tokens": 5})
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "stop"


async def test_ignore_eos_without_max_tokens_ends_at_the_context(node, client, model_id, eos_bias):
    n_ctx = node.models.all()[0].n_ctx
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, temperature=0,
                                                 logit_bias=eos_bias, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == n_ctx


async def test_min_tokens_holds_the_stop_strings_back_too(client, model_id):
    """vLLM's min_tokens: no stop before more than that many tokens are out, its stop strings included
    (they ended the reply at the first match, whatever min_tokens said: review r53); a stop string in the
    min_tokens-th token is held back too, and one after it still ends the reply (review r57)."""
    body = {"model": model_id, "prompt": "def join(a, b):\n    return", "max_tokens": 24, "temperature": 0}
    first = await client.completions.create(**body, logprobs=1)
    tokens = first.choices[0].logprobs.tokens
    k = next(i for i, t in enumerate(tokens) if t.strip()) + 1  # the first token with visible text (1-based)
    stop = tokens[k - 1].strip()
    stopped = await client.completions.create(**body, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text
    held = await client.completions.create(**body, stop=[stop], extra_body={"min_tokens": k})
    assert held.choices[0].text.startswith("".join(tokens[:k])), held.choices[0].text  # token k's text kept
    # a stop string first written after min_tokens ends the reply there
    later = next((t.strip() for t in tokens[k:] if t.strip() and t.strip() not in "".join(tokens[:k])), None)
    assert later is not None, tokens
    ended = await client.completions.create(**body, stop=[later], extra_body={"min_tokens": k})
    assert ended.choices[0].finish_reason == "stop" and later not in ended.choices[0].text, ended
    assert first.choices[0].text.startswith(ended.choices[0].text) and ended.usage.completion_tokens < 24
