"""Command R7B and Cohere2 MoE (node/inference/tools/cohere.py): their own tool-call format,
`<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>`, read
from the templates' own call text in any chunking, forced by the grammar, rendered back in the
history, and read from the answer after `<|START_THINKING|>…<|END_THINKING|>`; the answer's wrapper
(`<|START_RESPONSE|>…<|END_RESPONSE|>`, Cohere2 MoE's `<|START_TEXT|>…<|END_TEXT|>`) never reaches
the content. Until 2026-12-06 these templates got the generic JSON format: the model was prompted in a
format it was never taught, its own calls came back as text, and the results went back to it with
empty `tool_call_id`s."""

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
from node.inference.tools.cohere import MARKERS
from node.inference.tools.formats import new_parser
from tests.inference.conftest import needs_llama
from tests.inference.test_tool_formats_all import CALLS, TOOLS, template
from tests.inference.test_tools import accepts, parse, render, request

R7B, MOE = "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Cohere2MoE"
BOTH = pytest.mark.parametrize("name", [R7B, MOE])
WRAPPER = {R7B: ("<|START_RESPONSE|>", "<|END_RESPONSE|>"), MOE: ("<|START_TEXT|>", "<|END_TEXT|>")}
WEATHER_CALL = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                '"parameters": {"city": "Paris 2", "days": 2}}\n]<|END_ACTION|>')
TURN_END = "<|END_OF_TURN_TOKEN|>"


def _parse(name: str, reply: str, cuts=None, budget_cut=False):
    fmt = detect_format(template(name))
    return parse(fmt.name, reply, cuts, budget_cut=budget_cut, parser=new_parser(fmt, request([], tools=TOOLS)))


def _same(got, calls) -> bool:
    return [(c.name, json.loads(c.arguments)) for c in got] == [(c.name, json.loads(c.arguments)) for c in calls]


def _history(calls):
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            *({"role": "tool", "content": f"result {i}", "tool_call_id": c.id, "name": c.name}
              for i, c in enumerate(calls)),
            {"role": "user", "content": "And tomorrow?"}]


def _own_calls(name: str, calls) -> str:
    """The template's own text for an assistant turn making these calls (its action block)."""
    text = render(template(name), request(_history(calls), tools=TOOLS))
    start = text.index("<|START_ACTION|>", text.index("Weather in Paris?"))
    return text[start:text.index(TURN_END, start)]


@BOTH
def test_r7b_and_cohere2moe_are_detected_and_command_r_plus_is_not(name):
    """Command R+ writes `Action: ```json [...]```` as text: it keeps the generic format."""
    assert detect_format(template(name)).name == "cohere"
    assert detect_format(template("CohereForAI-c4ai-command-r-plus-tool_use")).name == "generic"


@BOTH
def test_the_templates_own_calls_parse_back_in_any_chunking(name):
    """Two calls as the template writes them (a string that looks like a number, a boolean, an
    array), with text around them, cut at any point: the same calls and content as the whole."""
    reply = "Let me look." + _own_calls(name, CALLS) + "Done."
    whole = _parse(name, reply)
    assert _same(whole[0], CALLS), reply
    assert json.loads(whole[0][1].arguments)["note"] == "42"
    assert whole[1] == "Let me look.Done."
    for cut in range(len(reply)):
        got, content, streamed, rebuilt = _parse(name, reply, [cut])
        assert [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in whole[0]], cut
        assert content == whole[1] and streamed == content, cut
        assert [r[1:] for r in rebuilt] == [[c.name, c.arguments] for c in got]
    got, content, _, _ = _parse(name, WEATHER_CALL, list(range(len(WEATHER_CALL))))
    assert _same(got, CALLS[:1]) and content == ""


@BOTH
def test_the_answers_wrapper_never_reaches_the_content(name):
    """The answer as the template writes it, `<|START_RESPONSE|>text<|END_RESPONSE|>`, in any
    chunking (single characters too), when tools are offered: the text alone is the content, as it
    streams; a reply cut before the closing tag (or ending without it) keeps its text, not the tag's start."""
    open_, close = WRAPPER[name]
    reply = f"{open_}It is <b>sunny</b> [ok].{close}"
    for cuts in ([], *([c] for c in range(len(reply))), list(range(len(reply)))):
        got, content, streamed, _ = _parse(name, reply, cuts)
        assert got == [] and content == streamed == "It is <b>sunny</b> [ok].", cuts
    _, content, streamed, _ = _parse(name, f"{open_}Half an ans{close[:5]}", budget_cut=True)
    assert content == streamed == "Half an ans"
    _, content, streamed, _ = _parse(name, f"{open_}No closing tag")  # (ended by itself)
    assert content == streamed == "No closing tag"


@BOTH
@pytest.mark.parametrize("reply", [
    '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_time", "parameters": [1]}]<|END_ACTION|>',  # not an object
    '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_time", "parameters": {"tz": "UT',  # ended inside
    '<|START_ACTION|>{"tool_name": "get_time", "parameters": {}}<|END_ACTION|>',  # not a list
    "<|START_ACTION|>[]<|END_ACTION|>",  # no call
])
def test_broken_call_text_comes_back_as_content(name, reply):
    got, content, _, _ = _parse(name, reply)
    assert got == [] and content == reply


def test_a_call_cut_by_the_token_budget_is_not_content():
    reply = 'Sure.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Par'
    parser = new_parser(detect_format(template(R7B)), request([], tools=TOOLS))
    got, content, _, _ = parse("cohere", reply, budget_cut=True, parser=parser)
    assert got == [] and content == "Sure."
    assert parser.cut_call.name == "get_weather"


@BOTH
def test_the_history_goes_through_the_template(name):
    """The tools are shown once in the template's own words; the history's calls render as the
    template's action block (which reads back as the same calls), and each result answers its call's
    counter (the generic format left them all `"tool_call_id": ""`)."""
    text = render(template(name), request(_history(CALLS), tools=TOOLS))
    assert text.count('{"name": "set_flags"') == 1, text
    got, content, _, _ = _parse(name, _own_calls(name, CALLS))
    assert _same(got, CALLS) and content == ""
    at = text.index("<|START_TOOL_RESULT|>", text.index("Weather in Paris?"))
    results = text[at:text.index("<|END_TOOL_RESULT|>", at)]
    assert '"tool_call_id": "0"' in results and '"tool_call_id": "1"' in results, results
    assert "result 0" in results and "result 1" in results


@BOTH
def test_thoughts_are_kept_apart_from_calls(name):
    """A plan in `<|START_THINKING|>…<|END_THINKING|>` is reasoning, never read for calls; an action
    right after the plan (without the closing tag) also ends it, as llama.cpp reads Cohere2 MoE."""
    tmpl = template(name)
    user = [{"role": "user", "content": "hi"}]
    req = request(user, tools=TOOLS)
    prompt = render(tmpl, req)
    fmt = detect_format(tmpl)
    replies = [(f"<|START_THINKING|>I call <|START_ACTION|> later.<|END_THINKING|>{WEATHER_CALL}", ())]
    replies.append((f"<|START_THINKING|>I need the weather.{WEATHER_CALL}", fmt.thought_ends))
    for reply, ends in replies:
        if prompt.endswith("<|START_THINKING|>"):  # (Cohere2 MoE's generation prompt opens them)
            reply = reply.removeprefix("<|START_THINKING|>")
        splitter = splitter_for(req, tmpl, prompt, None, ends)
        thoughts, answer = splitter.feed(reply)
        more = splitter.finish()
        thoughts, answer = thoughts + more[0], answer + more[1]
        got, content, _, _ = _parse(name, answer)
        assert _same(got, CALLS[:1]) and content == "", (reply, answer)
        assert thoughts.startswith("I ") and "get_weather" not in thoughts


def _compact(action: str) -> str:
    """The template's action block with each call in compact JSON (the node's forced JSON is
    compact: free whitespace could go on forever), one call a line as the template lays them out."""
    calls = json.loads(action.removeprefix("<|START_ACTION|>").removesuffix("<|END_ACTION|>"))
    lines = ",\n    ".join(json.dumps(c, separators=(",", ":")) for c in calls)
    return f"<|START_ACTION|>[\n    {lines}\n]<|END_ACTION|>"


@pytest.fixture(scope="module")
def cohere_tok(tmp_path_factory):
    """A tokenizer whose vocabulary has Cohere's tags as control tokens."""
    path = write_gguf(tmp_path_factory.mktemp("cohere") / "cohere.gguf",
                      SynthSpec(control_tokens=(*MARKERS, "<|START_THINKING|>", "<|END_THINKING|>")))
    tok = ModelTokenizer(path)
    yield tok
    tok.close()


@needs_llama
@BOTH
def test_the_forced_grammar_writes_the_calls_as_the_template_does(cohere_tok, name):
    """tool_choice required / named and a response_format beside the tools: the grammar allows the
    action block as the template writes it (one call, or two when parallel calls are allowed), and
    nothing else."""
    fmt = detect_format(template(name))
    user = [{"role": "user", "content": "hi"}]
    required = tool_grammar(fmt, request(user, choice="required", tools=TOOLS))
    named = tool_grammar(fmt, request(user, choice="function", name="get_weather", tools=TOOLS))
    either = tool_grammar(fmt, dataclasses.replace(request(user, tools=TOOLS), response_format=ResponseFormat("json_object")))
    for spec in (required, named, either):
        grammar.validate(spec)
    one = _compact(_own_calls(name, CALLS[:1]))
    two = _compact(_own_calls(name, (CALLS[0], ToolCall("call_c3", "get_time", '{"tz": "UTC"}'))))
    assert one.startswith('<|START_ACTION|>[\n    {"tool_call_id":"0","tool_name":"get_weather","parameters":{"city"')
    assert _same(_parse(name, two)[0], (CALLS[0], ToolCall("call_c3", "get_time", '{"tz": "UTC"}')))
    assert accepts(cohere_tok, required, one) and accepts(cohere_tok, named, one) and accepts(cohere_tok, either, one), one
    assert accepts(cohere_tok, required, two) and not accepts(cohere_tok, named, two), two
    assert accepts(cohere_tok, either, '{"answer":42}') and not accepts(cohere_tok, required, '{"answer":42}')
    assert not accepts(cohere_tok, required, "Sure, let me check.")
    assert not accepts(cohere_tok, required, one.replace('"city"', '"town"'))  # a required parameter left out


@needs_llama
@BOTH
@pytest.mark.parametrize("params", [{}, {"properties": {"q": {"type": "string"}}}])
def test_a_forced_calls_parameters_are_an_object_whatever_the_schema_leaves_out(cohere_tok, name, params):
    """`parameters: {}` (no parameters) or a schema without "type": the grammar still holds the call's
    `parameters` to an object, as every other format's (before, it allowed "s", null, [] or 3, which the
    parser then refused: the call reached the client as content)."""
    fmt = detect_format(template(name))
    spec = tool_grammar(fmt, request([{"role": "user", "content": "hi"}], choice="required",
                                     tools=(ToolSpec("lookup", "", params),)))
    grammar.validate(spec)
    call = '<|START_ACTION|>[\n    {"tool_call_id":"0","tool_name":"lookup","parameters":%s}\n]<|END_ACTION|>'
    assert accepts(cohere_tok, spec, call % "{}")
    for bad in ('"s"', "null", "[]", "3"):
        assert not accepts(cohere_tok, spec, call % bad), bad


@BOTH
def test_a_reply_that_starts_inside_the_answer_the_prompt_opened(name):
    """The generation prompt ends with the answer's opener (R7B's default template): the parser starts
    inside the wrapper, so its closer is not content (before, it was: its opener was in the prompt)."""
    from node.inference.tools.cohere import opened_answer
    opener, closer = WRAPPER[name]
    assert opened_answer("<|CHATBOT_TOKEN|>" + opener) == (opener, closer) and opened_answer("<|CHATBOT_TOKEN|>") is None
    fmt = detect_format(template(name))
    for cuts in (None, [3, 7, 9], list(range(1, 30))):
        got = parse(fmt.name, "Hello" + closer, cuts, parser=new_parser(fmt, request([], tools=TOOLS), opened=opener))
        assert got[0] == [] and got[1] == "Hello" and got[2] == "Hello", (cuts, got)


@needs_llama
@BOTH
def test_an_answer_beside_tools_may_be_wrapped_as_the_template_writes_it(cohere_tok, name):
    """tool_choice auto with a response_format: the answer is the JSON in the model's own wrapper
    (R7B `<|START_RESPONSE|>`, Cohere2 MoE `<|START_TEXT|>`), either tag optional (llama.cpp's
    cohere2moe grammar); the parser keeps the JSON alone as content. Before, only bare JSON was allowed,
    which these models never write."""
    opener, closer = WRAPPER[name]
    fmt = detect_format(template(name))
    spec = tool_grammar(fmt, dataclasses.replace(request([{"role": "user", "content": "hi"}], tools=TOOLS),
                                                 response_format=ResponseFormat("json_object")))
    grammar.validate(spec)
    for ok in (opener + '{"answer":42}' + closer, opener + '{"answer":42}', '{"answer":42}' + closer, '{"answer":42}'):
        assert accepts(cohere_tok, spec, ok), ok
    other = WRAPPER[MOE if name == R7B else R7B][0]
    for bad in (opener + "42" + closer, opener + opener + '{"answer":42}', other + '{"answer":42}', opener + "Sure."):
        assert not accepts(cohere_tok, spec, bad), bad
    got = _parse(name, opener + '{"answer":42}' + closer)
    assert got[0] == [] and got[1] == '{"answer":42}', got


def test_a_call_turns_thoughts_reach_r7bs_published_template_as_its_tool_plan():
    """R7B's published tool_use template writes `<|START_THINKING|>{{message.tool_plan}}<|END_THINKING|>`
    before an earlier turn's action (llama.cpp's copy, the fixture, reads `reasoning_content`): the
    turn's thoughts are its tool_plan (before, the template wrote an empty plan)."""
    from node.inference.chat import render_chat
    from node.inference.reasoning import with_history
    from node.inference.tools import prompt_inputs

    published = template(R7B).replace("message.reasoning_content", "message.tool_plan")
    assert "message.tool_plan" in published
    history = _history(CALLS[:1])
    history[1] = {**history[1], "reasoning_content": "I will look up the weather."}
    for tmpl in (published, template(R7B), template(MOE)):
        fmt = detect_format(tmpl)
        messages, tools = prompt_inputs(fmt, request(history, tools=TOOLS), tmpl, with_history)
        text = render_chat(tmpl, messages, tools=tools)
        at = text.index("<|START_ACTION|>", text.index("Weather in Paris?"))
        before = text[text.rindex("<|START_THINKING|>", 0, at):at].strip()
        assert before == "<|START_THINKING|>I will look up the weather.<|END_THINKING|>", before
