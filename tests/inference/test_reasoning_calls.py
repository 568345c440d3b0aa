"""Tool calls written inside unclosed thoughts (node.inference.reasoning with the tool format's
`thought_ends`): Kimi K2 Thinking, DeepSeek V3.1/V3.2/V4, GLM / Ling 3 and Qwen3.5 may call a tool
at the end of their thoughts without writing `</think>`, and llama.cpp's parsers end the reasoning
at the call's opener. Until 2026-12-06 the whole call came back as reasoning_content, no tool_calls,
finish_reason stop: the agent loop just stopped. The replies go through what the driver does
(generate.py: `splitter_for` with the format's openers, then the tool parser on the answer), with
the real templates' generation prompts, in any chunking."""

from __future__ import annotations

import json

import pytest

from node.inference.reasoning import ThoughtCounter, splitter_for
from node.inference.request import CompletionRequest
from node.inference.sampling import SamplingParams
from node.inference.synth import SynthSpec
from node.inference.think_budget import ThinkBudget, validate
from node.inference.think_budget import spec as budget_spec
from node.inference.tools import detect_format, thought_ends
from node.inference.tools.formats import new_parser
from tests.inference.test_tools import render, request, template
from tests.support.nodes import tiny_model

HI = [{"role": "user", "content": "Weather in Paris?"}]
THOUGHT = "I need the weather."
KIMI_CALL = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
             '{"city":"Paris"}<|tool_call_end|><|tool_calls_section_end|>')
DSML_CALL = ('<｜DSML｜{b}>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
             'Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜{b}>')
# (template, the reply after its generation prompt: thoughts never closed, then a call)
REPLIES = [
    ("Kimi-K2-Thinking", f"<think>{THOUGHT}{KIMI_CALL}"),
    ("Kimi-K2-Thinking", f"<think>{THOUGHT}\n" + KIMI_CALL.removeprefix("<|tool_calls_section_begin|>")),  # no section
    ("deepseek-ai-DeepSeek-V3.1", f"{THOUGHT}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
     '{"city":"Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("deepseek-ai-DeepSeek-V3.2", f"{THOUGHT}\n\n" + DSML_CALL.format(b="function_calls")),
    ("deepseek-ai-DeepSeek-V4", f"{THOUGHT}\n\n" + DSML_CALL.format(b="tool_calls")),
    ("Qwen3.5-4B", f"{THOUGHT}\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>"),
    ("GLM-4.7-Flash", f"{THOUGHT}<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"),
    ("inclusionai-ling-3.0-flash", f"{THOUGHT}\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
     "</arg_value>\n</tool_call>"),
]


def chunkings(text: str):
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


def drive(name: str, req: CompletionRequest, pieces: list[str], raw: bool = False):
    """(reasoning, content, calls) as CompletionRun._split puts them together."""
    tmpl = template(name)
    fmt = detect_format(tmpl)
    thoughts = splitter_for(req, tmpl, render(tmpl, req), None, thought_ends(fmt, req))
    parser = new_parser(fmt, req)
    reasoning = inline = ""
    for i, piece in enumerate([*pieces, ""]):
        final = i == len(pieces)
        if raw:
            more, text = thoughts.feed_raw(piece, final)
            inline += more
        else:
            more, text = thoughts.feed(piece) if piece else ("", "")
            if final:
                last, rest = thoughts.finish()
                more, text = more + last, text + rest
            reasoning += more
        if text:
            parser.feed(text)
    parser.finish(cut=False)
    return reasoning, inline + parser.content, [(c.name, json.loads(c.arguments)) for c in parser.calls]


@pytest.mark.parametrize(("name", "reply"), REPLIES)
def test_a_call_ends_unclosed_thoughts_in_any_chunking(name, reply):
    req = request(HI)
    for pieces in chunkings(reply):
        assert drive(name, req, pieces) == (THOUGHT, "", [("get_weather", {"city": "Paris"})]), pieces


@pytest.mark.parametrize(("name", "reply"), REPLIES)
def test_without_tools_the_openers_stay_thoughts(name, reply):
    """No tools offered (or tool_choice "none"): nothing but the closing tag ends the thoughts."""
    for req in (request(HI, tools=()), request(HI, choice="none")):
        reasoning, content, calls = drive(name, req, [reply])
        assert reasoning.startswith(THOUGHT) and len(reasoning) > len(THOUGHT) and content == "" and calls == []


@pytest.mark.parametrize(("name", "reply"), REPLIES)
def test_reasoning_format_none_keeps_the_thoughts_and_reads_the_call(name, reply):
    """reasoning_format "none": the thoughts as written stay content; the parser still gets the call."""
    req = request(HI)
    for pieces in ([reply], list(reply)):
        _, content, calls = drive(name, req, pieces, raw=True)
        assert calls == [("get_weather", {"city": "Paris"})] and content.strip() == reply[:reply.index(THOUGHT)
                                                                                        + len(THOUGHT)].strip()


def test_closed_thoughts_still_end_at_the_closing_tag():
    reply = f"<think>{THOUGHT}</think>\n\nLet me check.{KIMI_CALL}"
    for pieces in chunkings(reply):
        assert drive("Kimi-K2-Thinking", request(HI), pieces) == (
            THOUGHT, "Let me check.", [("get_weather", {"city": "Paris"})]), pieces


def test_the_call_opener_is_not_counted_as_a_thought():
    """usage's reasoning_tokens: the tokens in the thoughts, the opening tag included, not the call's."""
    tmpl, req = template("Kimi-K2-Thinking"), request(HI)
    counting = splitter_for(req, tmpl, render(tmpl, req), None, thought_ends(detect_format(tmpl), req))
    counter = ThoughtCounter(counting)
    tokens = ["<think>", "I", " need", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions",
              ".get_weather:0", "<|tool_call_argument_begin|>", "{}", "<|tool_call_end|>"]
    assert [counter.add(t.encode()) for t in tokens] == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]


def test_the_budget_spec_carries_the_openers():
    spec = budget_spec(5, "<think>", "</think>", True, ends=("<tool_call>",))
    assert validate(spec) == spec and "ends" not in budget_spec(5, "<think>", "</think>", True)
    wire = SamplingParams.from_wire(SamplingParams(reasoning_budget=spec).to_wire())
    assert wire.reasoning_budget["ends"] == ["<tool_call>"]
    for bad in (["x" * 65], [""], [1], "<tool_call>", ["<a>"] * 9):
        with pytest.raises((TypeError, ValueError)):
            validate({**spec, "ends": bad})


@pytest.mark.llama
def test_a_call_opener_ends_the_budget_count(tmp_path):
    """A thinking budget stops counting at a call's opener, as at the closing tag (llama-server's
    thinking_end_tags): the closing tag is never forced into the middle of the call."""
    from node.inference.tokenizer import ModelTokenizer  # (llama-cpp-python)

    tok = ModelTokenizer(tiny_model(tmp_path, SynthSpec(think=True), "thinker.gguf"))
    try:
        word = tok.tokenize("I", add_bos=False)[-1]
        opener = tok.tokenize("<tool_call>", add_bos=False)
        spec = budget_spec(len(opener) + 3, "<think>", "</think>", True, ends=("<tool_call>",))
        budget = ThinkBudget(tok, validate(spec))
        for token in [word, *opener, *[word] * 10]:
            assert budget.forcing is None
            budget.accept(token)
        assert budget.state == "done" and budget.remaining == 3  # the opener's last token is not counted
    finally:
        tok.close()
