"""gpt-oss's harmony format: detection, the reply split into thoughts, answer and tool calls in
every chunking (replies as the real template writes them, and the variants llama.cpp reads), and
history rendered back through the real template."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from node.inference import reasoning
from node.inference.chat import render_chat
from node.inference.request import ToolCall
from node.inference.tools import detect_format, new_parser, prompt_inputs, tool_grammar

TEMPLATE = (Path(__file__).resolve().parent.parent / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja").read_text()
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}]


def request(**kw):
    from node.api.schemas import parse_completion

    return parse_completion({"model": "m", "messages": kw.pop("messages", [{"role": "user", "content": "hi"}]), **kw},
                            "chat")


def split(reply: str, size: int, tools: bool = True) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, calls) of a reply fed `size` characters at a time, as a run does."""
    req = request(tools=TOOLS) if tools else request()
    splitter = reasoning.splitter_for(req, TEMPLATE, "", None)
    parser = new_parser(detect_format(TEMPLATE), req)
    thoughts = content = ""
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    for n, piece in enumerate(pieces + [""]):
        r, answer = splitter.feed(piece) if piece else splitter.finish()
        thoughts += r
        text, _ = parser.feed(answer)
        content += text
        if n == len(pieces):
            text, _ = parser.finish()
            content += text
    return thoughts, parser.content, parser.calls


def reply_of(messages: list[dict]) -> str:
    """The last assistant turn as the real template writes it (a training render), after `<|start|>assistant`."""
    text = render_chat(TEMPLATE, messages, add_generation_prompt=False)
    start = text.rfind("<|start|>user")
    return text[text.index("<|start|>assistant", start) + len("<|start|>assistant"):]


def test_detected_as_harmony():
    assert detect_format(TEMPLATE).name == "harmony"
    assert type(reasoning.splitter_for(request(), TEMPLATE, "", None)).__name__ == "HarmonySplitter"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 1000])
def test_thoughts_and_answer(size):
    reply = reply_of([{"role": "user", "content": "hi"},
                      {"role": "assistant", "thinking": "The user greets.", "content": "Hello!"}])
    assert reply.startswith("<|channel|>analysis<|message|>") and reply.endswith("<|return|>")
    assert split(reply, size, tools=False) == ("The user greets.", "Hello!", [])


CALLS = [
    # as gpt-oss writes them (llama.cpp's anchor): the recipient in the channel header, a constraint
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    # the recipient in the role header (as the template writes history), ` json`, `<|call|>` shown
    '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather'
    '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
    # no constraint; a stray commentary before the analysis; `<|end|>` not shown (a control token)
    "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Need the weather.<|start|>assistant"
    '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}',
]


@pytest.mark.parametrize("size", [1, 2, 4, 7, 1000])
@pytest.mark.parametrize("reply", CALLS)
def test_tool_call_variants(reply, size):
    thoughts, content, calls = split(reply, size)
    assert thoughts == "Need the weather."
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_preamble_is_content_and_builtin_tools_dropped(size):
    reply = ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=browser.search"
             '<|channel|>analysis<|message|>{"query": "x"}<|call|>'
             "<|start|>assistant<|channel|>final<|message|>Done.")
    assert split(reply, size) == ("", "Checking.Done.", [])


def test_call_without_tools_is_dropped_and_plain_text_is_content():
    reply = '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}'
    assert split(reply, 3, tools=False) == ("", "", [])
    assert split("just text, no headers", 4, tools=False) == ("", "just text, no headers", [])


def test_reasoning_format_none_keeps_the_analysis_as_written():
    splitter = reasoning.splitter_for(request(), TEMPLATE, "", None)
    reply = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Yes."
    inline, answer = splitter.feed_raw(reply, final=True)
    assert (inline, answer) == ("<|channel|>analysis<|message|>Hm.<|end|>", "Yes.")


def test_history_renders_calls_thoughts_and_results():
    """A tool-calling turn goes back as the template expects: thoughts in `thinking`, each call its
    own assistant message and each result after its call (the template renders a message's first
    call only and names a result after the call before it)."""
    calls = [{"id": i, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
             for i, c in (("call_a", "Paris"), ("call_b", "Rome"))]
    messages = [{"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": "", "reasoning_content": "Two cities.", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_b", "name": "get_weather", "content": "rain"}]
    req = request(messages=messages, tools=TOOLS)
    fmt = detect_format(TEMPLATE)
    rendered, tools = prompt_inputs(fmt, req, TEMPLATE)
    text = render_chat(TEMPLATE, reasoning.with_history(req.messages, rendered), tools=tools,
                       extra={"reasoning_effort": "high"})
    assert "Reasoning: high" in text
    assert ("<|start|>assistant<|channel|>analysis<|message|>Two cities.<|end|>"
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"rain"<|end|>') in text
    assert text.endswith("<|start|>assistant")


def test_forced_call_grammar_writes_harmony():
    spec = tool_grammar(detect_format(TEMPLATE), request(tools=TOOLS, tool_choice="required"))
    splitter = reasoning.splitter_for(request(tools=TOOLS), TEMPLATE, "", None)
    whole = splitter.grammar(spec, close_is_token=True)
    text = json.dumps(whole)
    assert '"commentary to=functions.get_weather "' in text and '"<|constrain|>"' in text
    assert '"analysis"' in text  # room for the thoughts first


def test_dropped_text_is_quoted_in_the_log_only_at_debug(caplog):
    """Text where a harmony header belongs is dropped with a warning; the warning quoted the model's
    reply into every node.log (found 2026-12-06): the text is at -v (DEBUG) only."""
    reply = "<|channel|>analysis<|message|>hmm<|end|>SECRET-WORDS-9 no header<|message|>x"
    with caplog.at_level(logging.INFO):
        split(reply, 1000)
    assert "no message header was dropped" in caplog.text and "SECRET-WORDS-9" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        split(reply, 1000)
    assert "SECRET-WORDS-9" in caplog.text
