"""What Open WebUI sends to an OpenAI connection beyond OpenAI's fields, through the official openai
SDK (`extra_body`) against a real node serving a tiny reasoning model (DeepSeek-R1's template).

Open WebUI copies every "Advanced Params" value a user has set, in their settings or on a model,
into the body of each request to an OpenAI connection (backend/open_webui/utils/payload.py,
apply_params_to_form_data and apply_model_params_to_body_openai: any key not in its own short
list goes in as it is), the Ollama ones included: a user who once set "Context Length (Ollama)"
(`num_ctx`) got a 400 "unrecognized request argument supplied: num_ctx" on every request to the
node (open-webui issues #14514, #14520 num_keep, #19906 keep_alive, #26457 num_batch), and v0.6.7
sent its `tool_servers` list (#13617).
- load-time options (`num_ctx`, `num_batch`, `num_keep`, `num_thread`, `num_gpu`, `use_mmap`,
  `use_mlock`, `keep_alive`) and `tool_servers` change nothing;
- `think` (bool) is the template's enable_thinking, "low"/"medium"/"high" a reasoning_effort;
- `format` ("json", a JSON schema or its text) is the response_format it means;
- anything else in them is a 400 naming the field and the setting to change.
"""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from node.inference.synth import SynthSpec
from node.inference.tools.deepseek_r1 import MARKERS as R1_MARKERS
from tests.support.nodes import template, tiny_models_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SPEC = SynthSpec(n_ctx=2048, think=True, control_tokens=R1_MARKERS,
                 chat_template=template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), name="thinker")
# templates that read what the R1 one ignores: gpt-oss's writes `Reasoning: low|medium|high`
# (reasoning_effort), gemma 4's thinks only when enable_thinking is true (its default is false)
GPTOSS = SynthSpec(n_ctx=2048, harmony=True, chat_template=template("openai-gpt-oss-120b"), name="gptoss")
GEMMA = SynthSpec(n_ctx=2048, gemma4=True, chat_template=template("google-gemma-4-31B-it"), name="gemma4")
ASK = [{"role": "user", "content": "Is the sky blue?"}]
# Open WebUI's Advanced Params at the values its UI puts in when "Custom" is clicked (and typical edits)
OLLAMA_PARAMS = {"num_ctx": 8192, "num_batch": 512, "num_keep": 24, "num_thread": 4, "num_gpu": 99,
                 "use_mmap": True, "use_mlock": False, "keep_alive": "5m", "top_k": 40, "min_p": 0.0,
                 "mirostat": 0, "mirostat_eta": 0.1, "mirostat_tau": 5.0, "tfs_z": 1, "repeat_last_n": 64,
                 "repeat_penalty": 1.0}
TOOL_SERVERS = [{"url": "http://localhost:8081", "openapi": {"openapi": "3.1.0", "paths": {}},
                 "info": {"title": "time"}, "specs": [{"name": "get_time", "parameters": {"type": "object"}}]}]

node = tiny_models_node(SPEC, GPTOSS, GEMMA)


def model_named(node, name):
    return next(m.id for m in node.models.all() if name in m.id)


@pytest.fixture
def model(node):
    return model_named(node, "thinker")


async def prompt(node, name, **fields) -> str:
    """The prompt a chat renders to (llama-server's /apply-template: nothing runs)."""
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{node.api.port}/apply-template", headers={"Authorization": f"Bearer {node.api_key}"},
            json={"model": model_named(node, name), "messages": ASK, **fields}) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["prompt"]


@pytest.fixture
def kw(node):
    thinker = next(m for m in node.models.all() if "thinker" in m.id)
    ids = thinker.tokenizer.tokenize("</think>", add_bos=False)
    assert len(ids) == 1, ids
    return dict(max_tokens=6, temperature=0, logit_bias={str(ids[0]): -100})


async def reply(client, model, **kw):
    r = await client.chat.completions.create(model=model, messages=ASK, **kw)
    return getattr(r.choices[0].message, "reasoning_content", None), r.choices[0].message.content, r.usage


async def test_open_webui_ollama_params_change_nothing(client, model, kw):
    plain = await reply(client, model, **kw)
    sent = await reply(client, model, **kw, user="u", extra_body={**OLLAMA_PARAMS, "tool_servers": TOOL_SERVERS})
    assert sent[:2] == plain[:2] and sent[2].prompt_tokens == plain[2].prompt_tokens
    pieces = []
    async with await client.chat.completions.create(model=model, messages=ASK, stream=True, **kw,
                                                    stream_options={"include_usage": True},
                                                    extra_body=OLLAMA_PARAMS) as events:
        async for chunk in events:
            pieces += [getattr(c.delta, "reasoning_content", None) or "" for c in chunk.choices]
    assert "".join(pieces) == plain[0]


async def test_open_webui_think_is_enable_thinking(client, model, kw):
    on = await reply(client, model, **kw)
    off = await reply(client, model, **kw, extra_body={"think": False})
    kwargs_off = await reply(client, model, **kw, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off[:2] == kwargs_off[:2] and off[0] is None and off[2].prompt_tokens == on[2].prompt_tokens + 1
    assert (await reply(client, model, **kw, extra_body={"think": True}))[:2] == on[:2]
    # think: "low" as reasoning_effort: test_reasoning_effort_reaches_a_template_that_writes_it
    with pytest.raises(openai.BadRequestError) as caught:
        await reply(client, model, **kw, extra_body={"think": "maybe"})
    assert caught.value.body["param"] == "think" and "Think (Ollama)" in caught.value.body["message"]


async def test_open_webui_format_is_the_response_format(client, model):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    kw = dict(max_tokens=12, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    native = await reply(client, model, **kw, response_format={"type": "json_schema",
                                                               "json_schema": {"name": "x", "schema": schema}})
    for typed in (json.dumps(schema), schema):  # as text (Open WebUI sends what was typed) or an object
        got = await reply(client, model, **{**kw, "extra_body": {**kw["extra_body"], "format": typed}})
        assert got[1] == native[1]
    as_json = await reply(client, model, **{**kw, "extra_body": {**kw["extra_body"], "format": "json"}})
    assert as_json[1] == (await reply(client, model, **kw, response_format={"type": "json_object"}))[1]
    for bad in ({"format": "yaml"}, {"format": "json", "response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as caught:
            await reply(client, model, max_tokens=4, extra_body=bad)
        assert caught.value.body["param"] == "format"


async def test_ollama_fields_still_refused_elsewhere(client, model):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={"think": False})
    assert caught.value.body["param"] == "think"
    with pytest.raises(openai.BadRequestError) as caught:  # not in what Open WebUI sends: still unknown
        await client.chat.completions.create(model=model, messages=ASK, max_tokens=2, extra_body={"num_predict": 5})
    assert caught.value.body["param"] == "num_predict"


async def test_roo_code_lm_studio_draft_model_and_openrouter_provider_change_nothing(client, model, kw):
    """Roo Code's LM Studio provider adds `draft_model` when speculative decoding is on
    (src/api/providers/lm-studio.ts); its OpenRouter provider, whose base URL can be this node's,
    adds `provider` routing preferences (src/api/providers/openrouter.ts). Both were a 400."""
    plain = await reply(client, model, **kw)
    sent = await reply(client, model, **kw, extra_body={
        "draft_model": "qwen2.5-0.5b-instruct",
        "provider": {"order": ["local"], "only": ["local"], "allow_fallbacks": False}})
    assert sent[:2] == plain[:2] and sent[2].prompt_tokens == plain[2].prompt_tokens


async def test_openrouter_reasoning_object_is_what_it_means(client, model, kw):
    """OpenRouter's `reasoning` (Roo Code's OpenRouter provider: {effort} or {max_tokens}; aider's
    `openrouter/` models via extra_body; Cline's Claude-family routes {enabled, max_tokens})."""
    # an effort the R1 template ignores could not fail here: see the gpt-oss template's test
    got = await reply(client, model, **kw, extra_body={"reasoning": {"effort": "none"}})
    assert got[:2] == (await reply(client, model, **kw, reasoning_effort="none"))[:2]
    off = await reply(client, model, **kw, extra_body={"reasoning": {"enabled": False, "max_tokens": 5}})
    assert off[:2] == (await reply(client, model, **kw, reasoning_effort="none"))[:2] and off[0] is None
    budget = await reply(client, model, **kw, extra_body={"reasoning": {"enabled": True, "max_tokens": 5}})
    assert budget[:2] == (await reply(client, model, **kw, extra_body={"reasoning_budget_tokens": 5}))[:2]
    none = await reply(client, model, **kw, extra_body={"reasoning": {"enabled": True, "max_tokens": 0}})
    assert none[:2] == off[:2]  # a budget of 0 is thinking off, as llama-server's (review r37)
    kept = await reply(client, model, **kw, extra_body={"reasoning": {"exclude": True}})
    assert kept[:2] == (None, (await reply(client, model, **kw))[1])  # out of `content` too
    for bad, param in (({"reasoning": {"exclude": True}, "reasoning_format": "none"}, "reasoning.exclude"),
                       ({"reasoning": {"max_tokens": "8k"}}, "reasoning.max_tokens"),
                       ({"reasoning": {"summary": "auto"}}, "reasoning")):
        with pytest.raises(openai.BadRequestError) as caught:
            await reply(client, model, **kw, extra_body=bad)
        assert caught.value.body["param"] == param


async def test_open_webui_format_text_is_parsed_as_the_body_is(client, model):
    """Open WebUI sends "Format" as typed text: a lone surrogate escape in it reached the grammar
    engine (a 500 with a traceback each request), deep nesting was an uncaught RecursionError (a 500)
    and NaN / 1e999 a 400 naming response_format (2026-12-07). Each is the `format` 400 now."""
    for typed in ('{"type": "string", "enum": ["\\ud800"]}', "[" * 50000 + "]" * 50000,
                  '{"type": "number", "maximum": NaN}', '{"type": "number", "maximum": 1e999}'):
        with pytest.raises(openai.BadRequestError) as caught:
            await reply(client, model, max_tokens=4, extra_body={"format": typed})
        assert caught.value.body["param"] == "format", caught.value.body


async def test_reasoning_effort_reaches_a_template_that_writes_it(node):
    """gpt-oss's template writes the effort (the R1 template ignores it, so comparing replies there
    could not fail): `reasoning.effort`, `think: "low"` and `reasoning_effort` render the same."""
    for effort in ("low", "high"):
        native = await prompt(node, "gptoss", reasoning_effort=effort)
        assert f"Reasoning: {effort}" in native
        assert await prompt(node, "gptoss", reasoning={"effort": effort}) == native
        assert await prompt(node, "gptoss", think=effort) == native


async def test_openrouter_reasoning_on_and_off_are_enable_thinking(node):
    """OpenRouter's `reasoning` on / off is the template's enable_thinking, as `think` is, and an
    explicit chat_template_kwargs.enable_thinking wins (2026-12-07, review r35: `enabled: false`
    beat it, and `enabled: true` or a budget left a template that thinks only when asked without)."""
    thinking, off = await prompt(node, "gemma4", think=True), await prompt(node, "gemma4", think=False)
    assert thinking != off and thinking == await prompt(node, "gemma4")  # the node's default is on
    for reasoning in ({"enabled": True}, {"max_tokens": 2000}, {"effort": "high", "exclude": True}):
        assert await prompt(node, "gemma4", reasoning=reasoning) == thinking, reasoning
    assert await prompt(node, "gemma4", reasoning={"enabled": False}) == off
    assert await prompt(node, "gemma4", reasoning={"enabled": True},
                        chat_template_kwargs={"enable_thinking": False}) == off
    on = await prompt(node, "thinker")
    assert await prompt(node, "thinker", reasoning={"enabled": False}) != on
    assert await prompt(node, "thinker", reasoning={"enabled": False},
                        chat_template_kwargs={"enable_thinking": True}) == on


async def test_openrouter_reasoning_exclude_leaves_the_thoughts_out(client, model, kw):
    """OpenRouter's `exclude: true`: the model still thinks, the reply does not carry it (it came
    back in reasoning_content until 2026-12-07, review r35)."""
    thoughts, content, _ = await reply(client, model, **kw)
    assert thoughts
    got = await reply(client, model, **kw, extra_body={"reasoning": {"exclude": True}})
    assert got[0] is None and got[1] == content
    pieces, text = [], []
    async with await client.chat.completions.create(model=model, messages=ASK, stream=True, **kw,
                                                    extra_body={"reasoning": {"exclude": True}}) as events:
        async for chunk in events:
            pieces += [getattr(c.delta, "reasoning_content", None) for c in chunk.choices]
            text += [c.delta.content or "" for c in chunk.choices]
    assert not any(pieces) and "".join(text) == content


@pytest.mark.parametrize("arguments", ['{"a": ' * 50000 + "1" + "}" * 50000, '{"a": ' * 129 + "1" + "}" * 129,
                                       '{"a": "\\ud800"}'])
async def test_tool_call_arguments_are_parsed_as_the_body_is(client, model, arguments):
    """An assistant turn's call sent back with deeply nested arguments (a RecursionError) or a lone
    surrogate escape in them (the tokenizer's UnicodeEncodeError) was a 500 with a traceback, in
    chat and in responses (2026-12-07, review r37): a 400 naming the arguments now. Past 128 levels is
    refused before the parser recurses (a collection at the recursion limit failed a finalizer, CI)."""
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=model, messages=messages, max_tokens=2)
    assert caught.value.body["param"] == "messages[1].tool_calls[0].function.arguments", caught.value.body
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=model, max_output_tokens=2, input=[
            {"role": "user", "content": "Is the sky blue?"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "call_1", "output": "ok"}])
    assert "arguments" in caught.value.body["message"], caught.value.body


async def test_openrouter_reasoning_exclude_leaves_the_thoughts_logprobs_out(client, model, kw):
    """`exclude: true` with logprobs: the reply left reasoning_content out but its logprobs listed
    every thought token, where a stream left them out (2026-12-07, review r37). Both leave them out."""
    plain = await client.chat.completions.create(model=model, messages=ASK, logprobs=True, **kw)
    assert plain.choices[0].logprobs.content  # the thoughts' tokens (kw bans </think>: all of them)
    hidden = await client.chat.completions.create(model=model, messages=ASK, logprobs=True, **kw,
                                                  extra_body={"reasoning": {"exclude": True}})
    streamed = []
    async with await client.chat.completions.create(model=model, messages=ASK, logprobs=True, stream=True, **kw,
                                                    extra_body={"reasoning": {"exclude": True}}) as events:
        async for chunk in events:
            streamed += [t.token for c in chunk.choices if c.logprobs for t in c.logprobs.content or ()]
    assert [t.token for t in hidden.choices[0].logprobs.content or ()] == streamed == []


async def test_openrouter_reasoning_budget_zero_is_thinking_off(node):
    """`reasoning: {max_tokens: 0}` turned thinking on with a budget of 0 (2026-12-07, review r37);
    llama-server's reasoning budget 0 is thinking off, and so is this."""
    off = await prompt(node, "gemma4", think=False)
    assert await prompt(node, "gemma4", reasoning={"max_tokens": 0}) == off
    assert await prompt(node, "thinker", reasoning={"max_tokens": 0}) == await prompt(node, "thinker", think=False)
