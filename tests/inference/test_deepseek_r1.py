"""DeepSeek R1 and its distills (node/inference/tools/deepseek_r1.py): their own tool-call format,
`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` and a fenced JSON block, read
from the templates' own call text in any chunking, forced by the grammar, rendered back in the
history, and read from the answer after the thoughts. Until 2026-12-06 these templates got the
generic JSON format: the model was prompted in a format it was never taught, and its own calls
came back as text."""

from __future__ import annotations

import dataclasses
import json

import pytest

from node.inference import grammar
from node.inference.reasoning import splitter_for
from node.inference.request import ResponseFormat, ToolCall
from node.inference.synth import SynthSpec, write_gguf
from node.inference.tokenizer import ModelTokenizer
from node.inference.tools import detect_format, tool_grammar
from node.inference.tools.deepseek_r1 import MARKERS
from node.inference.tools.formats import new_parser
from tests.inference.conftest import needs_llama
from tests.inference.test_tool_formats_all import CALLS, TOOLS, template, template_reply
from tests.inference.test_tools import accepts, parse, render, request

R1 = ["deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "llama-cpp-deepseek-r1"]
CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
WEATHER_CALL = f'{CALL}get_weather\n```json\n{{"city": "Paris 2", "days": 2}}\n```<｜tool▁call▁end｜>'
SECTION = f"<｜tool▁calls▁begin｜>{WEATHER_CALL}<｜tool▁calls▁end｜>"


def _parse(name: str, reply: str, cuts=None):
    fmt = detect_format(template(name))
    return parse(fmt.name, reply, cuts, parser=new_parser(fmt, request([], tools=TOOLS)))


def _same(got, calls) -> bool:
    return [(c.name, json.loads(c.arguments)) for c in got] == [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name", R1)
def test_r1_calls_cut_anywhere(name):
    """The template's own call text, with text before and after it, streamed in two pieces cut at
    any point: the same calls and content as the whole reply."""
    assert detect_format(template(name)).name == "deepseek_r1"
    reply = "Let me look that up." + template_reply(name, CALLS) + "\nDone."
    whole = _parse(name, reply)
    assert _same(whole[0], CALLS), reply
    assert whole[1] == "Let me look that up.\nDone."
    for cut in range(len(reply)):
        got, content, streamed, rebuilt = _parse(name, reply, [cut])
        assert [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in whole[0]], cut
        assert content == whole[1] and streamed.replace("\n", "") == content.replace("\n", ""), cut
        assert [r[1:] for r in rebuilt] == [[c.name, c.arguments] for c in got]


@pytest.mark.parametrize("reply", [
    WEATHER_CALL,  # a call without the section (llama.cpp's parser allows it)
    f'<｜tool▁calls▁begin｜>{CALL}get_weather\n{{"city": "Paris 2", "days": 2}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    f'<｜tool▁calls▁begin｜>{CALL}get_weather\n```json\n{{"city": "Paris 2", "days": 2}}\n```',  # ends left out
])
def test_r1_calls_written_loosely_still_count(reply):
    for cuts in ([], list(range(len(reply)))):
        got, content, _, _ = _parse(R1[0], reply, cuts)
        assert _same(got, CALLS[:1]) and content == ""


@pytest.mark.parametrize("reply", [
    f"<｜tool▁calls▁begin｜>{CALL}get weather\n```json\n{{}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    f"<｜tool▁calls▁begin｜>{CALL}get_time\n```json\nUTC\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    f'<｜tool▁calls▁begin｜>{CALL}get_time\n```json\n{{"tz": "UT',  # ended inside the arguments
    "<｜tool▁calls▁begin｜>[get_time]<｜tool▁calls▁end｜>",
])
def test_broken_r1_call_text_comes_back_as_content(reply):
    got, content, _, _ = _parse(R1[0], reply)
    assert got == [] and content == reply


def _history(calls):
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "sunny, 21C", "tool_call_id": calls[0].id, "name": calls[0].name},
            {"role": "user", "content": "And tomorrow?"}]


@pytest.mark.parametrize("name", R1)
def test_the_history_calls_parse_back_and_the_tools_are_shown(name):
    """Each template's rendering of the history's calls reads back as the same calls (R1-Distill-Llama
    renders calls only for a turn whose content is none, and concatenates their arguments as text),
    and the tools are shown once, with the call syntax (the distills' templates show none)."""
    tmpl = template(name)
    text = render(tmpl, request(_history(CALLS), tools=TOOLS))
    start = text.index("<｜Assistant｜><｜tool▁calls▁begin｜>") + len("<｜Assistant｜>")
    section = text[start:text.index("<｜end▁of▁sentence｜>", start)]
    got, content, _, _ = _parse(name, section)
    assert _same(got, CALLS) and content == "", section
    assert text.count("You can call any of the following function tools") == 1
    assert text.count('"name": "set_flags"') == 1 and "sunny, 21C" in text


@pytest.mark.parametrize("name", R1)
def test_thoughts_are_not_read_for_calls(name):
    """The generation prompt opens the thoughts (`<think>\\n`): the calls are read from the answer
    alone, also when a call opens without `</think>` first (the format's `thought_ends`, as DeepSeek
    V3.1's)."""
    tmpl = template(name)
    user = [{"role": "user", "content": "hi"}]
    for reply, ends in ((f"I need <｜tool▁calls▁begin｜> first.</think>\n\n{SECTION}", ()),
                        (f"I need the weather.{SECTION}", detect_format(tmpl).thought_ends)):
        splitter = splitter_for(request(user, tools=TOOLS), tmpl, render(tmpl, request(user, tools=TOOLS)), None, ends)
        thoughts, answer = splitter.feed(reply)
        more = splitter.finish()
        thoughts, answer = thoughts + more[0], answer + more[1]
        got, content, _, _ = _parse(name, answer)
        assert _same(got, CALLS[:1]) and content == ""
        assert thoughts.strip().startswith("I need") and "get_weather" not in thoughts


@pytest.fixture(scope="module")
def r1_tok(tmp_path_factory):
    """A tokenizer whose vocabulary has R1's call markers as control tokens (as R1's GGUFs do)."""
    path = write_gguf(tmp_path_factory.mktemp("r1") / "r1.gguf", SynthSpec(control_tokens=MARKERS, think=True))
    tok = ModelTokenizer(path)
    yield tok
    tok.close()


@needs_llama
@pytest.mark.parametrize("name", R1)
def test_the_forced_grammar_writes_the_calls_as_the_template_does(r1_tok, name):
    """tool_choice required / named and a response_format beside the tools: the grammar allows
    the calls as the template writes them (one, or two when parallel calls are allowed), and
    nothing else."""
    fmt = detect_format(template(name))
    user = [{"role": "user", "content": "hi"}]
    required = tool_grammar(fmt, request(user, choice="required", tools=TOOLS))
    named = tool_grammar(fmt, request(user, choice="function", name="get_weather", tools=TOOLS))
    either = tool_grammar(fmt, dataclasses.replace(request(user, tools=TOOLS), response_format=ResponseFormat("json_object")))
    for spec in (required, named, either):
        grammar.validate(spec)
    one = template_reply(name, CALLS[:1]).strip()
    two = template_reply(name, (CALLS[0], ToolCall("call_c3", "get_time", '{"tz": "UTC"}'))).strip()
    if "<｜tool▁calls▁end｜>" not in one:  # (R1-Distill-Llama's template closes the section only after a second call)
        one += "<｜tool▁calls▁end｜>"
    # (JSON as the grammar writes it: compact)
    one, two = (t.replace(": ", ":").replace(", ", ",") for t in (one, two))
    assert accepts(r1_tok, required, one) and accepts(r1_tok, named, one) and accepts(r1_tok, either, one), one
    assert accepts(r1_tok, required, two) and not accepts(r1_tok, named, two), two
    assert accepts(r1_tok, either, '{"answer":42}') and not accepts(r1_tok, required, '{"answer":42}')
    assert not accepts(r1_tok, required, "Sure, let me check.")
    assert not accepts(r1_tok, required, one.replace('"city"', '"town"'))  # a required parameter left out


@pytest.mark.parametrize("name", R1)
def test_text_beside_a_call_keeps_the_call(name):
    """A turn with text beside its call: every R1 template renders the call (as its own turn, the
    text a plain turn before it). R1-Distill-Llama renders calls only when content is none and
    llama.cpp's fixed template only when it is empty: until 2026-12-06 they rendered the text alone,
    and the model saw a result for a call it never made."""
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "Checking.", "tool_calls": (call,)},
               {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}]
    text = render(template(name), request(history, tools=TOOLS))
    assert f"{MARKERS[0]}" in text and "get_weather\n```json" in text, text
    assert text.index("Checking.") < text.index("get_weather\n```json") < text.index("sunny"), text


def test_the_tool_list_goes_before_the_system_text():
    """A distill's template renders no tools: the node writes llama.cpp's R1 tool list where llama.cpp's
    fixed template does, before the system prompt's text (after it until 2026-12-06)."""
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    for name in R1[:2]:
        text = render(template(name), request(history, tools=TOOLS))
        assert text.index("You can call any of the following function tools") < text.index("Be brief."), text
