"""MiniMax M2 (node/inference/tools/minimax.py): its own tool-call format, `<minimax:tool_call>`
`<invoke name="NAME">` `<parameter name="K">value</parameter>` `</invoke>` `</minimax:tool_call>`, read
from the template's own call text in any chunking, forced by the grammar, rendered back in the
history, and read from the answer after the thoughts; `[e~[` ends the generation. Until 2026-12-06
its template got the generic JSON format: the model was prompted in a format it was never taught,
and its own calls came back as text."""

from __future__ import annotations

import dataclasses
import json

import pytest

from node.inference import grammar
from node.inference.reasoning import splitter_for
from node.inference.request import ResponseFormat, ToolCall, ToolSpec
from node.inference.synth import SynthSpec, write_gguf
from node.inference.tokenizer import ModelTokenizer
from node.inference.tools import detect_format, tool_grammar
from node.inference.tools.formats import new_parser
from node.inference.tools.minimax import MARKERS
from tests.inference.conftest import needs_llama
from tests.inference.test_tool_formats_all import CALLS, TOOLS, template, template_reply
from tests.inference.test_tools import accepts, parse, render, request

M2 = "MiniMax-M2"
WEATHER_CALL = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris 2</parameter>\n'
                '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>')


def _parse(reply: str, cuts=None, budget_cut=False):
    fmt = detect_format(template(M2))
    return parse(fmt.name, reply, cuts, budget_cut=budget_cut, parser=new_parser(fmt, request([], tools=TOOLS)))


def _same(got, calls) -> bool:
    return [(c.name, json.loads(c.arguments)) for c in got] == [(c.name, json.loads(c.arguments)) for c in calls]


def test_m2_is_detected_and_m1_m3_are_not_read_as_it():
    """M3 (`]<]minimax[>[` and each parameter its own tag) and M1 (JSON lines in `<tool_calls>`) write
    their calls otherwise: they keep the generic format."""
    assert detect_format(template(M2)).name == "minimax_m2"
    assert detect_format(template("MiniMax-M3")).name == "generic"
    assert detect_format(template("MiniMax-M1")).name == "generic"


def test_m2_calls_cut_anywhere():
    """The template's own call text (two calls, a string that looks like a number, a boolean, an
    array), with text before and after it, streamed in two pieces cut at any point: the same calls
    and content as the whole reply."""
    reply = "Let me look that up." + template_reply(M2, CALLS) + "\nDone."
    whole = _parse(reply)
    assert _same(whole[0], CALLS), reply
    assert json.loads(whole[0][1].arguments)["note"] == "42"  # (a string parameter stays a string)
    assert whole[1].replace("\n", "") == "Let me look that up.Done."
    for cut in range(len(reply)):
        got, content, streamed, rebuilt = _parse(reply, [cut])
        assert [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in whole[0]], cut
        assert content == whole[1] and streamed.replace("\n", "") == content.replace("\n", ""), cut
        assert [r[1:] for r in rebuilt] == [[c.name, c.arguments] for c in got]


def test_m2_calls_in_any_chunking_of_single_characters():
    got, content, _, _ = _parse(WEATHER_CALL, list(range(len(WEATHER_CALL))))
    assert _same(got, CALLS[:1]) and content == ""


@pytest.mark.parametrize("reply", [
    WEATHER_CALL.removesuffix("</minimax:tool_call>"),  # the block's end left out: the call stands
    WEATHER_CALL.replace("\n", ""),  # no newlines between the tags
])
def test_m2_calls_written_loosely_still_count(reply):
    for cuts in ([], list(range(len(reply)))):
        got, content, _, _ = _parse(reply, cuts)
        assert _same(got, CALLS[:1]) and content == ""


@pytest.mark.parametrize("reply", [
    '<minimax:tool_call>\n<invoke name="get weather">\n</invoke>\n</minimax:tool_call>',  # not a name
    '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="tz">UT',  # ended inside a value
    '<minimax:tool_call>\n{"name": "get_time"}\n</minimax:tool_call>',  # JSON, not invokes
    "<minimax:tool_call>\n</minimax:tool_call>",  # no call in the block
])
def test_broken_m2_call_text_comes_back_as_content(reply):
    got, content, _, _ = _parse(reply)
    assert got == [] and content == reply


def test_a_call_cut_by_the_token_budget_is_not_content():
    """max_tokens ends the reply inside a value: the call is `cut_call` with the parameters written
    whole (none yet), and its markup is not content."""
    reply = 'Sure.<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Par'
    parser = new_parser(detect_format(template(M2)), request([], tools=TOOLS))
    got, content, _, _ = parse("minimax_m2", reply, budget_cut=True, parser=parser)
    assert got == [] and content == "Sure."
    assert (parser.cut_call.name, parser.cut_call.arguments) == ("get_weather", "{")


def _history(calls):
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "sunny, 21C", "tool_call_id": calls[0].id, "name": calls[0].name},
            {"role": "user", "content": "And tomorrow?"}]


def test_the_history_calls_parse_back_and_the_tools_are_shown():
    """The template's rendering of the history's calls reads back as the same calls; the result goes
    in as the template's own `]~b]tool` turn (the generic format's calls as text made this template
    refuse it), and the tools are shown in the template's own words, once."""
    text = render(template(M2), request(_history(CALLS), tools=TOOLS))
    start = text.index("<minimax:tool_call>", text.index("]~b]ai\n"))  # (the system prompt shows an example)
    section = text[start:text.index("[e~[", start)]
    got, content, _, _ = _parse(section)
    assert _same(got, CALLS) and content == "", section
    assert text.count("<tools>") == 1 and text.count('"name": "set_flags"') == 1, text
    assert "]~b]tool\n<response>sunny, 21C</response>[e~[" in text


def test_thoughts_are_not_read_for_calls():
    """The generation prompt opens the thoughts (`<think>\\n`): the calls are read from the answer
    alone, also when a call opens without `</think>` first (the format's `thought_ends`)."""
    tmpl = template(M2)
    user = [{"role": "user", "content": "hi"}]
    prompt = render(tmpl, request(user, tools=TOOLS))
    assert prompt.endswith("]~b]ai\n<think>\n")
    for reply, ends in ((f"I need <minimax:tool_call> first.\n</think>\n\n{WEATHER_CALL}", ()),
                        (f"I need the weather.\n{WEATHER_CALL}", detect_format(tmpl).thought_ends)):
        splitter = splitter_for(request(user, tools=TOOLS), tmpl, prompt, None, ends)
        thoughts, answer = splitter.feed(reply)
        more = splitter.finish()
        thoughts, answer = thoughts + more[0], answer + more[1]
        got, content, _, _ = _parse(answer)
        assert _same(got, CALLS[:1]) and content == ""
        assert thoughts.strip().startswith("I need") and "get_weather" not in thoughts


@pytest.fixture(scope="module")
def m2_tok(tmp_path_factory):
    """A tokenizer whose vocabulary has M2's markers as control tokens and `<think>`/`</think>`."""
    path = write_gguf(tmp_path_factory.mktemp("m2") / "m2.gguf", SynthSpec(control_tokens=MARKERS, think=True))
    tok = ModelTokenizer(path)
    yield tok
    tok.close()


@needs_llama
def test_the_turn_end_marker_ends_the_generation(m2_tok):
    """`[e~[` closes every turn in M2's template: a vocabulary that has it ends the generation there."""
    ids = m2_tok.tokenize("[e~[", add_bos=False, special=True)
    assert len(ids) == 1 and m2_tok.is_eog(ids[0])
    call = m2_tok.tokenize("<minimax:tool_call>", add_bos=False, special=True)
    assert len(call) == 1 and not m2_tok.is_eog(call[0])


@needs_llama
def test_the_forced_grammar_writes_the_calls_as_the_template_does(m2_tok):
    """tool_choice required / named and a response_format beside the tools: the grammar allows
    the calls as the template writes them (one, or two when parallel calls are allowed), and
    nothing else."""
    fmt = detect_format(template(M2))
    user = [{"role": "user", "content": "hi"}]
    required = tool_grammar(fmt, request(user, choice="required", tools=TOOLS))
    named = tool_grammar(fmt, request(user, choice="function", name="get_weather", tools=TOOLS))
    either = tool_grammar(fmt, dataclasses.replace(request(user, tools=TOOLS), response_format=ResponseFormat("json_object")))
    for spec in (required, named, either):
        grammar.validate(spec)
    one = template_reply(M2, CALLS[:1]).strip()
    two = template_reply(M2, (CALLS[0], ToolCall("call_c3", "get_time", '{"tz": "UTC"}'))).strip()
    assert accepts(m2_tok, required, one) and accepts(m2_tok, named, one) and accepts(m2_tok, either, one), one
    assert accepts(m2_tok, required, two) and not accepts(m2_tok, named, two), two
    assert accepts(m2_tok, either, '{"answer":42}') and not accepts(m2_tok, required, '{"answer":42}')
    assert not accepts(m2_tok, required, "Sure, let me check.")
    assert not accepts(m2_tok, required, one.replace('"city"', '"town"'))  # a required parameter left out


@needs_llama
def test_a_string_parameters_enum_holds_in_the_forced_call(m2_tok):
    """A string value is written raw: its enum is kept as the choice of its strings (free text let
    the model write any city, or never end the value)."""
    city = ToolSpec("get_weather", "", {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                                        "required": ["city"]})
    spec = tool_grammar(detect_format(template(M2)), request([], choice="required", tools=(city,)))
    call = '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">{}</parameter>\n</invoke>\n</minimax:tool_call>'
    assert accepts(m2_tok, spec, call.format("Rome")) and not accepts(m2_tok, spec, call.format("Berlin"))
