"""Google Gemma 4's own tool-call format (node.inference.tools.gemma4): its notation's values, the
forced grammar's parameter order, and the tool results as each of its two templates reads them.
(The template's own calls parsed back in any chunking, the forced grammar accepting them, and the
thinking channel kept from the tool parser: tests/inference/test_tool_formats_all.py.)"""

from __future__ import annotations

import json

import pytest

from node.inference.reasoning import splitter_for
from node.inference.request import ToolCall, ToolSpec
from node.inference.tools import detect_format, tool_grammar
from node.inference.tools.formats import new_parser
from tests.inference.test_tool_formats_all import FLAGS, TOOLS, template
from tests.inference.test_tools import TIME, accepts, parse, render, request

NAMES = ["google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"]
NESTED = ToolSpec("plan", "Plan", {"type": "object", "properties": {
    "opts": {"type": "object"}, "n": {"type": "number"}, "x": {"type": "null"}, "label": {"type": "string"}}})


def test_gemma_values_nested_and_json():
    """Gemma's notation (unquoted keys, `<|"|>` strings, nested objects and arrays) and JSON (what the
    forced grammar writes for an object parameter) both come back as the same JSON arguments."""
    fmt = detect_format(template(NAMES[0]))
    own = '<|tool_call>call:plan{label:<|"|>a, b: {c}<|"|>,n:-1.5,opts:{deep:true,tags:[<|"|>a<|"|>,2]},x:null}<tool_call|>'
    as_json = '<|tool_call>call:plan{label:<|"|>a, b: {c}<|"|>,n:-1.5,opts:{"deep":true,"tags":["a",2]},x:null}<tool_call|>'
    want = {"label": "a, b: {c}", "n": -1.5, "opts": {"deep": True, "tags": ["a", 2]}, "x": None}
    for reply in (own, as_json):
        for cuts in (None, list(range(len(reply)))):
            got, content, _, rebuilt = parse("gemma4", "Sure. " + reply, cuts,
                                             parser=new_parser(fmt, request([], tools=(NESTED,))))
            assert [(c.name, json.loads(c.arguments)) for c in got] == [("plan", want)] and content == "Sure."
            assert [r[1:] for r in rebuilt] == [[c.name, c.arguments] for c in got]


def test_the_forced_grammar_keeps_the_templates_key_order(tok):
    """The template writes the arguments sorted by key (`dictsort`); the grammar does too, with a
    comma only between two, the required keys always, and `{}` for a tool without required ones."""
    fmt = detect_format(template(NAMES[0]))
    required = tool_grammar(fmt, request([{"role": "user", "content": "hi"}], choice="required", tools=(FLAGS, TIME)))
    assert accepts(tok, required, '<|tool_call>call:set_flags{ids:[1,2],note:<|"|>x y<|"|>,on:true}<tool_call|>')
    assert accepts(tok, required, "<|tool_call>call:set_flags{ids:[],on:false}<tool_call|>")
    assert accepts(tok, required, "<|tool_call>call:get_time{}<tool_call|>")
    assert accepts(tok, required, '<|tool_call>call:get_time{tz:<|"|>UTC<|"|>}<tool_call|>')
    assert not accepts(tok, required, "<|tool_call>call:set_flags{on:true,ids:[1]}<tool_call|>")  # unsorted
    assert not accepts(tok, required, "<|tool_call>call:set_flags{,ids:[1],on:true}<tool_call|>")
    assert not accepts(tok, required, "<|tool_call>call:set_flags{ids:[1]}<tool_call|>")  # `on` left out


@pytest.mark.parametrize("name", NAMES)
def test_tool_results_are_the_templates_tool_responses(name):
    """Each result follows its call as `<|tool_response>response:NAME{...}<tool_response|>` in the
    model's turn (a JSON result as Gemma's notation): the newer template reads OpenAI `tool`
    messages itself, the older one (-interleaved) gets them as `tool_responses` (a `tool` message
    was a `<|turn>tool` turn it was never trained on). Until 2026-12-06 both got the generic JSON
    format, and the older one's results were not tool responses at all."""
    calls = (ToolCall("call_a1", "get_weather", '{"city": "Paris"}'), ToolCall("call_b2", "get_time", "{}"))
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "content": '{"temp": 21, "sky": "clear"}', "tool_call_id": "call_a1", "name": "get_weather"},
               {"role": "tool", "content": "noon", "tool_call_id": "call_b2", "name": "get_time"},
               {"role": "assistant", "content": "Clear, 21C at noon."},
               {"role": "user", "content": "Thanks"}]
    text = render(template(name), request(history, tools=TOOLS))
    assert ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_time{}<tool_call|>'
            in text), text
    assert "<|turn>tool" not in text
    assert "<|tool_response>response:get_time{value:<|\"|>noon<|\"|>}<tool_response|>" in text
    assert "response:get_weather{" in text and "Clear, 21C at noon.<turn|>" in text


def _split(name: str, reply: str, cuts: list[int]) -> tuple[str, str]:
    """(reasoning, content) of `reply` fed in pieces cut at `cuts`, through the chat's splitter."""
    hi = [{"role": "user", "content": "hi"}]
    tmpl = template(name)
    splitter = splitter_for(request(hi), tmpl, render(tmpl, request(hi)), None)
    thoughts = content = ""
    for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True):
        r, c = splitter.feed(reply[a:b])
        thoughts, content = thoughts + r, content + c
    r, c = splitter.finish()
    return thoughts + r, content + c


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("reply", "thoughts", "answer"), [
    ("<|channel>thought\nLet me see.<channel|>Paris is sunny.<|channel>thought\n<channel|>", "Let me see.", "Paris is sunny."),
    ("Paris is sunny.<|channel>thought\n<channel|>", "", "Paris is sunny."),
    ("<|channel>thought\n<channel|>Paris is sunny.<channel|>", "", "Paris is sunny."),
    ("Paris.<|channel>thought\nAnd Rome?<channel|>", "And Rome?", "Paris."),
])
def test_an_empty_thought_block_after_the_answer_is_not_content(name, reply, thoughts, answer):
    """Gemma 4 may end its answer with an empty `<|channel>thought<channel|>` (or a lone `<channel|>`);
    llama.cpp's parser reads every such block as thoughts. Until 2026-12-06 the splitter saw one block
    at the start only: the client got `<|channel>thought<channel|>` at the end of its content."""
    for cut in range(len(reply) + 1):
        assert _split(name, reply, [cut]) == (thoughts, answer), cut
    assert _split(name, reply, list(range(1, len(reply)))) == (thoughts, answer)


def test_the_thought_tag_is_its_control_token_and_text():
    """`<|channel>thought`: the reply's text must show the control token `<|channel>`, and a grammar
    spells it as that token (one literal of its own) before the text."""
    from node.inference import grammar as g
    from node.inference.reasoning import GEMMA4_THINK, ReasoningSplitter

    splitter = ReasoningSplitter(GEMMA4_THINK, inside=False)
    assert "<|channel>" in splitter.markers
    spec = splitter.grammar(g.json_value({"type": "object"}), close_is_token=True)
    opened = spec["items"][0]
    assert opened["items"][:2] == [g.literal("<|channel>"), g.literal("thought")], opened
