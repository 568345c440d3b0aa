"""What real local apps send, on the default model through the official openai SDK: requests
llama-server answers must not be a 400 here either.

- Continue sends its whole stop list to any host but api.openai.com, groq, Azure and Jan
  (core/llm/llms/OpenAI.ts `_convertArgs`): autocomplete's list holds a dozen or more sequences.
- Agent apps (MCP servers, pydantic-generated tools) send tool schemas with keywords and formats
  constrained decoding cannot hold (`format: "path"` for a pathlib.Path, `uniqueItems` for a set,
  `propertyNames`, `not`): llama-server ignores what its grammar cannot express; a 400 here failed
  every request that merely listed such a tool.
- A tool whose `parameters` omit `"type": "object"` (or are `{}`) still takes an object of
  arguments: forced, it must come back as a tool call, never as the raw JSON in `content`.
- Claude Code sends `context_management` with every /v1/messages request while prompt caching is
  on (and posts to /v1/messages?beta=true): a 400 failed them all.
"""

from __future__ import annotations

import json

import aiohttp
import anthropic
import pytest

from tests.support.nodes import anthropic_client, default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "What does os.path.join do?"}]

node = default_model_node("app-compat")


# Continue's autocomplete stops for a Python file (template stops, multiline stops, keywords)
CONTINUE_STOPS = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>", "</fim_middle>",
                  "</code>", "\n\n", "\r\n\r\n", "/src/", "#- coding: utf-8", "```", "\ndef", "\nclass", "\n\"\"\"#"]


async def test_a_continue_sized_stop_list_is_served_and_each_sequence_stops(client, model_id):
    whole = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0)
    text = whole.choices[0].message.content
    assert "pathname" in text, text  # the default model's greedy answer: "Join two or more pathname ..."
    stops = [*CONTINUE_STOPS, "pathname"]  # the one that matches comes last, past OpenAI's 4
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0,
                                                 stop=stops)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == text[:text.index("pathname")]
    completion = await client.completions.create(model=model_id, prompt="def join(", max_tokens=8, temperature=0,
                                                 stop=CONTINUE_STOPS)
    assert completion.choices[0].finish_reason in ("stop", "length")


def _tool(name: str, properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} a path",
                                             "parameters": {"type": "object", "properties": properties}}}


# schemas as MCP servers and pydantic write them; constrained decoding holds none of these keywords
UNHELD = [
    _tool("read_file", {"path": {"type": "string", "format": "path", "maxLength": 20}}),  # pydantic Path
    _tool("tag_files", {"tags": {"type": "array", "uniqueItems": True, "maxItems": 2,      # pydantic set[str]
                                 "items": {"type": "string", "maxLength": 8}}}),
    _tool("set_env", {"env": {"type": "object", "maxProperties": 1, "propertyNames": {"pattern": "^[A-Z]+$"},
                              "additionalProperties": {"type": "string", "maxLength": 8}}}),
    _tool("rename", {"name": {"type": "string", "maxLength": 12, "not": {"const": ""}}}),
]


@pytest.mark.parametrize("tool", UNHELD, ids=[t["function"]["name"] for t in UNHELD])
async def test_tool_schemas_with_keywords_the_grammar_cannot_hold_are_served(client, model_id, tool):
    name = tool["function"]["name"]
    other = _tool("lookup_docs", {"name": {"type": "string", "maxLength": 20}})
    # listed beside another tool, not called: a chat turn of an agent app
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0,
                                                 tools=[other, tool])
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # forced: a call of it whose arguments are an object
    forced = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=80, temperature=0,
                                                  tools=[other, tool],
                                                  tool_choice={"type": "function", "function": {"name": name}})
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [c.function.name for c in choice.message.tool_calls] == [name]
    assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments), dict)


@pytest.mark.parametrize("parameters", [
    {"properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]},
    {},
], ids=["no-type", "empty"])
async def test_tool_parameters_without_a_type_still_take_an_object(client, model_id, parameters):
    tool = {"type": "function", "function": {"name": "lookup_docs", "description": "Look up docs",
                                             "parameters": parameters}}
    for choice in ("required", {"type": "function", "function": {"name": "lookup_docs"}}):
        reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=60,
                                                     temperature=0, tools=[tool], tool_choice=choice,
                                                     parallel_tool_calls=False)
        answer = reply.choices[0]
        assert answer.finish_reason == "tool_calls", answer
        assert answer.message.tool_calls and answer.message.tool_calls[0].function.name == "lookup_docs"
        assert isinstance(json.loads(answer.message.tool_calls[0].function.arguments), dict)


# as Claude Code sends it (the beta messages API: /v1/messages?beta=true with an anthropic-beta header)
CONTEXT_MANAGEMENT = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"},
                                {"type": "clear_tool_uses_20250919",
                                 "trigger": {"type": "input_tokens", "value": 100000}}]}


async def test_claude_code_context_management_is_accepted(node, model_id):
    claude = anthropic_client(node)
    system = [{"type": "text", "text": "You answer briefly.", "cache_control": {"type": "ephemeral"}}]
    plain = await claude.messages.create(model=model_id, max_tokens=12, messages=QUESTION, system=system,
                                         extra_body={"temperature": 0})
    msg = await claude.beta.messages.create(model=model_id, max_tokens=12, messages=QUESTION, system=system,
                                            betas=["context-management-2025-06-27"],
                                            context_management=CONTEXT_MANAGEMENT,
                                            thinking={"type": "enabled", "budget_tokens": 1024},
                                            extra_body={"temperature": 0})
    assert [b.text for b in msg.content] == [b.text for b in plain.content]  # no edit changes this prompt
    async with claude.beta.messages.stream(model=model_id, max_tokens=12, messages=QUESTION, system=system,
                                           betas=["context-management-2025-06-27"],
                                           context_management=CONTEXT_MANAGEMENT,
                                           extra_body={"temperature": 0}) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == plain.content[0].text
    counted = await claude.beta.messages.count_tokens(model=model_id, messages=QUESTION, system=system,
                                                      betas=["context-management-2025-06-27"],
                                                      context_management=CONTEXT_MANAGEMENT)
    assert counted.input_tokens == plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError):  # its shape is still checked
        await claude.messages.create(model=model_id, max_tokens=4, messages=QUESTION,
                                     extra_body={"context_management": {"edits": "all"}})


async def test_output_config_effort_is_accepted_and_changes_nothing(node, model_id):
    """opencode sends `output_config.effort` with every request; it was a 400. A template that does
    not read `reasoning_effort` (this one; gpt-oss's does: test_api_harmony_routes.py) gives the
    reply without it; a value not in the API's list is still a 400."""
    claude = anthropic_client(node)
    plain = await claude.messages.create(model=model_id, max_tokens=12, messages=QUESTION, extra_body={"temperature": 0})
    tuned = await claude.messages.create(model=model_id, max_tokens=12, messages=QUESTION,
                                         extra_body={"temperature": 0, "output_config": {"effort": "high"}})
    assert [b.text for b in tuned.content] == [b.text for b in plain.content]
    with pytest.raises(anthropic.BadRequestError) as err:
        await claude.messages.create(model=model_id, max_tokens=4, messages=QUESTION,
                                     extra_body={"output_config": {"effort": "extreme"}})
    assert "output_config.effort" in err.value.body["error"]["message"]


async def test_a_base_url_without_v1_is_served_as_llama_server_serves_it(node, client, model_id):
    """An app given http://host:port (no /v1) posts to /chat/completions, /models, /responses:
    llama-server answers them, this node said 404 "no route for this path". The key still guards
    them; /v1/health is open as /health is."""
    import openai

    prefixed = client
    bare = prefixed.with_options(base_url=f"http://127.0.0.1:{node.api.port}")  # its http client: no new TLS context
    reply = await bare.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, temperature=0)
    same = await prefixed.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == same.choices[0].message.content
    stream = await bare.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == \
        same.choices[0].message.content
    assert [m.id async for m in bare.models.list()] == [m.id async for m in prefixed.models.list()]
    keyless = bare.with_options(api_key="wrong")
    for call in (keyless.models.list(), keyless.chat.completions.create(model=model_id, messages=QUESTION,
                                                                        max_tokens=2)):
        with pytest.raises(openai.AuthenticationError):
            await call
    base, key = f"http://127.0.0.1:{node.api.port}", {"Authorization": f"Bearer {node.api_key}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/responses", headers=key, json={"model": model_id, "input": "hi",
                                                                        "max_output_tokens": 4}) as r:
            assert r.status == 200 and (await r.json())["object"] == "response"
        async with session.get(f"{base}/v1/health") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"


async def test_the_anthropic_sdk_lists_models_with_its_model_info_fields(node, client, model_id):
    """The anthropic SDK's ModelInfo requires created_at, display_name and type: the OpenAI-shaped
    entry left them None (an app sorting by created_at or showing display_name failed). Asked with
    its `anthropic-version` header, each entry carries them; the OpenAI shape is unchanged."""
    from datetime import datetime

    claude = anthropic_client(node)
    page = await claude.models.list()
    listed = [m async for m in page]
    entry = node.models.all()[0]
    assert [m.id for m in listed] == [model_id] and page.has_more is False and page.last_id == model_id
    for info in (listed[0], await claude.models.retrieve(model_id)):
        assert info.type == "model" and info.display_name == entry.entry.name
        assert isinstance(info.created_at, datetime) and info.max_input_tokens == entry.n_ctx
    plain = await client.models.retrieve(model_id)
    assert plain.model_extra.get("display_name") is None and plain.created > 0
