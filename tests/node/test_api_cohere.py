"""Command R7B and Cohere2 MoE calling tools on the API, through the official `openai` client against a
real node serving tiny random models whose vocabulary has Cohere's tags (`<|START_ACTION|>`,
`<|START_RESPONSE|>`, `<|START_THINKING|>`, ...) as control tokens, with the real templates. A random
model writes no calls by itself: a forced call's grammar writes the format's action block, and a
logit_bias keeps the thoughts short (`_bias`). The format's parsing in every chunking is tests/inference/test_cohere.py's."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from node.inference.tools.cohere import MARKERS
from tests.support.nodes import template, tiny_models_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

TOKENS = (*MARKERS, "<|START_THINKING|>", "<|END_THINKING|>")
R7B = SynthSpec(n_ctx=8192, control_tokens=TOKENS, name="r7b",
                chat_template=template("CohereForAI-c4ai-command-r7b-12-2024-tool_use"))
MOE = SynthSpec(n_ctx=8192, control_tokens=TOKENS, name="moe", chat_template=template("Cohere2MoE"))
# a real R7B GGUF's default template (the shape of huggingface.js ollama-utils' automap for command-r7b):
# the tool-use body only beside documents, which empties `tools`; plain chat otherwise. Its tool_use
# template (the fixture) is `tokenizer.chat_template.tool_use`.
TOOL_USE = R7B.chat_template
PLAIN_CHAT = ("{% for message in messages %}<|START_OF_TURN_TOKEN|>{% if message.role == 'user' %}<|USER_TOKEN|>"
              "{% elif message.role == 'system' %}<|SYSTEM_TOKEN|>{% else %}<|CHATBOT_TOKEN|><|START_RESPONSE|>{% endif %}"
              "{{ message.content }}{% if message.role == 'assistant' %}<|END_RESPONSE|>{% endif %}<|END_OF_TURN_TOKEN|>"
              "{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>{% endif %}")
R7B_DEFAULT = ("{% if documents %}{% set tools = [] %}" + TOOL_USE.removeprefix("{{ bos_token }}") + "{% else %}"
               + "{{ bos_token }}" + PLAIN_CHAT + "{% endif %}")
BOTH_TEMPLATES = R7B.replace(name="cmdr-both", chat_template=R7B_DEFAULT, chat_templates=(("tool_use", TOOL_USE),))
DEFAULT_ONLY = R7B.replace(name="cmdr-plain", chat_template=R7B_DEFAULT)
# Command R+: its tool_use template writes calls as `Action: ```json`, a format read here as generic
PLUS = R7B.replace(name="cmdr-plus", chat_template="{{ bos_token }}" + PLAIN_CHAT, chat_templates=(
    ("tool_use", template("CohereForAI-c4ai-command-r-plus-tool_use")),))
# a template that shows the tools and opens the answer in its generation prompt
ANSWER_OPEN = R7B.replace(name="cmdr-answer", chat_template=TOOL_USE + "<|START_RESPONSE|>")
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


node = tiny_models_node(R7B, MOE, BOTH_TEMPLATES, DEFAULT_ONLY, ANSWER_OPEN, PLUS)


def _model(node, name: str):
    return next(m for m in node.models.all() if name in m.id)


def _bias(node, name: str) -> dict[str, int]:
    """Cohere2 MoE's generation prompt opens the thoughts: `<|END_THINKING|>` closes them at once;
    R7B's closes an empty plan, and the grammar lets it open one: `<|START_THINKING|>` is kept out."""
    tag, bias = ("<|START_THINKING|>", -100) if name == "r7b" else ("<|END_THINKING|>", 100)
    ids = _model(node, name).tokenizer.tokenize(tag, add_bos=False, special=True)
    assert len(ids) == 1
    return {str(ids[0]): bias}


async def _ask(client, stream: bool, **kw):
    """(content, reasoning, finish_reason, [(name, arguments)], the model's text from the logprobs)."""
    if not stream:
        r = await client.chat.completions.create(logprobs=True, **kw)
        msg = r.choices[0].message
        written = "".join(t.token for t in r.choices[0].logprobs.content)
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        return msg.content, getattr(msg, "reasoning_content", None), r.choices[0].finish_reason, calls, written
    content, reasoning, finish, parts, written = None, None, "", {}, ""
    async with await client.chat.completions.create(stream=True, logprobs=True, **kw) as events:
        async for chunk in events:
            for c in chunk.choices:
                written += "".join(t.token for t in (c.logprobs.content or [])) if c.logprobs else ""
                content = (content or "") + c.delta.content if c.delta.content else content
                more = getattr(c.delta, "reasoning_content", None)
                reasoning = (reasoning or "") + more if more else reasoning
                for d in c.delta.tool_calls or []:
                    name, args = parts.get(d.index, ("", ""))
                    parts[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
                finish = c.finish_reason or finish
    return content, reasoning, finish, list(parts.values()), written


@pytest.mark.parametrize("name", ["r7b", "moe"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_call_is_a_tool_call(node, client, name, stream, choice):
    """The forced call's grammar writes the action block (`<|START_ACTION|>[{"tool_call_id":"0",
    "tool_name":"get_weather","parameters":{...}}]<|END_ACTION|>`): the client gets a tool call, and
    none of the markup as content (the tags are control tokens: the parser sees them all the same)."""
    kw = dict(model=_model(node, name).id, messages=ASK, tools=[WEATHER], tool_choice=choice, max_tokens=200,
              logit_bias=_bias(node, name), parallel_tool_calls=False)
    content, _, finish, calls, written = await _ask(client, stream, **kw)
    # (the tags are control tokens: no logprob shows their text; whitespace may follow the thoughts'
    # closing tag before the action block, which a sampled reply sometimes writes)
    assert re.fullmatch(r'\s*\[\n    \{"tool_call_id":"[0-9]+","tool_name":"get_weather","parameters":\{"city":"(Paris|Rome)"\}\}\n\]',
                        written), written
    assert finish == "tool_calls", (written, content)
    assert [n for n, _ in calls] == ["get_weather"]
    assert json.loads(calls[0][1])["city"] in ("Paris", "Rome")
    assert not content


@pytest.mark.parametrize("name", ["r7b", "moe"])
async def test_history_reaches_the_template(node, name):
    """The tools, a tool-calling turn and its result go back through the template as Cohere writes
    them: the call as an action block, the result under the call's counter (the generic format gave
    the template its calls as text and every result `"tool_call_id": ""`)."""
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"model": _model(node, name).id, "messages": history, "tools": [WEATHER]}) as resp:
            assert resp.status == 200, await resp.text()
            prompt = (await resp.json())["prompt"]
    assert '{"name": "get_weather", "description": "Weather"' in prompt
    assert ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}'
            in prompt), prompt
    at = prompt.index("<|START_TOOL_RESULT|>", prompt.index("Weather in Paris?"))
    assert '"tool_call_id": "0"' in prompt[at:] and "sunny" in prompt[at:], prompt[at:]


async def _apply_template(node, model: str, **body) -> str:
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"model": model, **body}) as resp:
            assert resp.status == 200, await resp.text()
            return (await resp.json())["prompt"]


@pytest.mark.parametrize("name", ["cmdr-both", "cmdr-plain"])
async def test_tools_reach_the_model_whose_default_template_hides_them(node, client, name):
    """A real R7B GGUF: its default template renders the tools only beside documents; its tool_use
    template (`tokenizer.chat_template.tool_use`) renders them. With tools and tool_choice auto the
    prompt holds the tool: the tool_use template's where the GGUF has one (as llama.cpp picks it), the
    generic format's system message where it has not (before, the model never saw the tools)."""
    model = _model(node, name)
    prompt = await _apply_template(node, model.id, messages=ASK, tools=[WEATHER], tool_choice="auto")
    assert "get_weather" in prompt, prompt
    if name == "cmdr-both":
        assert '{"name": "get_weather", "description": "Weather"' in prompt, prompt  # (the tool_use template's list)
    r = await client.chat.completions.create(model=model.id, messages=ASK, tools=[WEATHER], tool_choice="auto",
                                             max_tokens=1)
    tok = model.tokenizer
    assert r.usage.prompt_tokens == len(tok.tokenize(prompt, add_bos=not prompt.startswith(tok.bos_text)))
    plain = await _apply_template(node, model.id, messages=ASK)  # no tools: the default template, as before
    assert "get_weather" not in plain and plain.endswith("<|CHATBOT_TOKEN|><|START_RESPONSE|>"), plain


async def test_the_tool_use_template_only_where_it_shows_the_tools_a_reply_may_call(node):
    """Found in review (2026-12-06): the tool_use template was taken for any request with tools. With
    tool_choice "none" (an agent forcing a final answer) the model got that template's call
    instructions around an empty tool list; Command R+'s tool_use template, whose `Action:` format is
    generic here, got an empty tool section and its own call syntax beside the generic one the grammar
    forces. Now: the default template then, as without tools."""
    both = _model(node, "cmdr-both").id
    plain = await _apply_template(node, both, messages=ASK)
    assert await _apply_template(node, both, messages=ASK, tools=[WEATHER], tool_choice="none") == plain
    plus = _model(node, "cmdr-plus").id
    prompt = await _apply_template(node, plus, messages=ASK, tools=[WEATHER], tool_choice="auto")
    assert "get_weather" in prompt and "Action:" not in prompt and "directly-answer" not in prompt, prompt


@pytest.mark.parametrize("name", ["cmdr-plain", "cmdr-answer"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_ends_at_the_closer_of_the_answer_the_prompt_opened(node, client, name, stream):
    """The generation prompt ends with `<|START_RESPONSE|>` (R7B's default template; with tools, one that
    shows them): the reply ends at `<|END_RESPONSE|>`, which is no end-of-generation token, and the tag
    never reaches the client (before: without tools the model wrote on past it to max_tokens; with
    tools, a shown marker outside any region it opened, the client got "<|END_RESPONSE|>…")."""
    model = _model(node, name)
    ids = model.tokenizer.tokenize("<|END_RESPONSE|>", add_bos=False, special=True)
    kw = dict(model=model.id, messages=ASK, max_tokens=6, logit_bias={str(ids[0]): 100})
    if name == "cmdr-answer":
        kw.update(tools=[WEATHER], tool_choice="auto")
        assert (await _apply_template(node, model.id, messages=ASK, tools=[WEATHER])).endswith("<|START_RESPONSE|>")
    content, _, finish, calls, _ = await _ask(client, stream, **kw)
    assert finish == "stop" and not calls, (finish, content)
    assert "END_RESPONSE" not in (content or "")
