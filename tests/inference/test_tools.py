"""Tool calling without a model: formats detected from real templates, prompts rendered by them,
replies in each format parsed (whole and in random chunks), the grammar specs compiled.

The replies parsed are what each template itself writes for an assistant message with tool calls:
the text the model was trained to produce."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.inference import constrain, grammar
from node.inference.chat import render_chat
from node.inference.request import CompletionRequest, ResponseFormat, ToolCall, ToolSpec
from node.inference.sampling import SamplingParams
from node.inference.tools import (
    FORMATS,
    ToolCallParser,
    detect_format,
    partial_object,
    prompt_inputs,
    tool_grammar,
)
from node.inference.tools.formats import generic_system_prompt, new_parser

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"
EXPECTED = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
}
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>")
WEATHER = ToolSpec("get_weather", "Current weather in a city",
                   {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"]})
TIME = ToolSpec("get_time", "The time in a time zone", {"type": "object", "properties": {"tz": {"type": "string"}}})
CALLS = (ToolCall("call_a1", "get_weather", '{"city": "Paris", "days": 2}'),
         ToolCall("call_b2", "get_time", '{"tz": "Europe/Paris \\u00e9"}'))


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def request(messages, *, choice="auto", name=None, parallel=True, tools=(WEATHER, TIME)) -> CompletionRequest:
    return CompletionRequest("chat", "m", False, False, SamplingParams(), messages=tuple(messages), tools=tools,
                             tool_choice=choice, tool_choice_name=name, parallel_tool_calls=parallel)


def render(tmpl: str, req: CompletionRequest, add_generation_prompt: bool = True) -> str:
    fmt = detect_format(tmpl)
    messages, tools = prompt_inputs(fmt, req, tmpl)
    return render_chat(tmpl, messages, bos_token="<s>", eos_token="</s>", add_generation_prompt=add_generation_prompt,
                       tools=tools)


def parse(fmt_name: str, text: str, cuts: list[int] | None = None, *, budget_cut: bool = False,
          parser: ToolCallParser | None = None):
    """(calls, final content, streamed content, streamed calls rebuilt from the deltas);
    `budget_cut`: max_tokens ended the reply."""
    parser = parser or ToolCallParser(FORMATS[fmt_name].syntax)
    pieces, last = [], 0
    for cut in sorted(set(cuts or [])):
        pieces.append(text[last:cut])
        last = cut
    pieces.append(text[last:])
    streamed, rebuilt = "", {}
    for piece in pieces:
        content, deltas = parser.feed(piece)
        streamed += content
        for d in deltas:
            _add_delta(rebuilt, d)
    content, deltas = parser.finish(cut=budget_cut)
    streamed += content
    for d in deltas:
        _add_delta(rebuilt, d)
    return parser.calls, parser.content, streamed, [rebuilt[k] for k in sorted(rebuilt)]


def _add_delta(rebuilt: dict, d) -> None:
    if d.id is not None:
        assert d.index not in rebuilt, "a call's id and name come once, in its first piece"
        rebuilt[d.index] = [d.id, d.name, d.arguments]
    else:
        assert d.index in rebuilt, "argument pieces follow the call's first piece"
        rebuilt[d.index][2] += d.arguments


def template_reply(name: str, calls: tuple[ToolCall, ...]) -> str:
    """What the template writes for an assistant turn making these calls (after the generation
    prompt, up to the end of the turn)."""
    tmpl = template(name)
    user = [{"role": "user", "content": "Weather and time in Paris?"}]
    prefix = render(tmpl, request(user))
    full = render(tmpl, request([*user, {"role": "assistant", "content": "", "tool_calls": calls}]),
                  add_generation_prompt=False)
    assert full.startswith(prefix), name
    reply = full[len(prefix):]
    ends = [reply.find(m) for m in END_OF_TURN if m in reply]
    return reply[: min(ends)] if ends else reply


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_format_detected_from_the_real_template(name):
    assert detect_format(template(name)).name == EXPECTED[name]


def test_templates_without_tools_get_the_generic_format():
    assert detect_format(None).name == "generic"
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    assert detect_format(chatml).name == "generic"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_real_template_shows_the_tools_and_the_history(name):
    tmpl = template(name)
    calls = CALLS[:1]
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "content": "sunny, 21C", "tool_call_id": "call_a1", "name": "get_weather"},
               {"role": "assistant", "content": "Sunny in Paris."},
               {"role": "user", "content": "And tomorrow?"}]
    text = render(tmpl, request(history))
    assert "get_weather" in text and "Current weather in a city" in text and '"city"' in text
    assert "sunny, 21C" in text and "Paris" in text
    none = render(tmpl, request(history, choice="none"))
    assert "Current weather in a city" not in none  # tool_choice none: the tools are not offered
    assert "sunny, 21C" in none  # but the history stays


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_templates_own_call_text_parses_back(name):
    fmt = EXPECTED[name]
    calls = CALLS[:1] if fmt == "llama3" else CALLS  # Llama 3.x templates take one call per turn
    reply = template_reply(name, calls)
    got, content, streamed, rebuilt = parse(fmt, reply)
    assert [(c.name, json.loads(c.arguments)) for c in got] == [(c.name, json.loads(c.arguments)) for c in calls]
    assert content == "" and streamed.strip() == ""
    assert [[c.id, c.name, c.arguments] for c in got] == rebuilt
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in got)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_chunkings_give_the_same_calls_and_content(data):
    name = data.draw(st.sampled_from(sorted(EXPECTED)))
    fmt = EXPECTED[name]
    calls = CALLS[:1] if fmt == "llama3" else CALLS
    reply = template_reply(name, calls)
    if fmt in ("hermes", "mistral"):
        reply = "Let me look that up. " + reply
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=12))
    whole = parse(fmt, reply)
    chunked = parse(fmt, reply, cuts)
    assert [(c.name, c.arguments) for c in chunked[0]] == [(c.name, c.arguments) for c in whole[0]]
    assert chunked[1] == whole[1]
    assert chunked[2].strip() == chunked[1]  # what was streamed is the content
    assert [r[1:] for r in chunked[3]] == [[c.name, c.arguments] for c in chunked[0]]


GENERIC_REPLIES = [
    ('{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}', [("get_weather", {"city": "Paris"})], ""),
    ('{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_time","arguments":{}}]}',
     [("get_weather", {"city": "Oslo"}), ("get_time", {})], ""),
    ('{"response":"It is \\"sunny\\" \\u00e9\\ud83d\\ude00 today."}', [], 'It is "sunny" é😀 today.'),
    ('{"response":"cut sho', [], "cut sho"),  # max_tokens inside the response: the text so far
    # a response_format's answer (tool_choice "auto"): its JSON text as written is the content
    ('{"response": {"verdict":"no","n":[1, {"x":"}"}]} }', [], '{"verdict":"no","n":[1, {"x":"}"}]}'),
    ('{"response":{"verdict":"n', [], '{"verdict":"n'),
]


@pytest.mark.parametrize(("reply", "calls", "content"), GENERIC_REPLIES)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(0, 120), max_size=10))
def test_generic_replies_in_any_chunking(reply, calls, content, cuts):
    got, final, streamed, rebuilt = parse("generic", reply, [c for c in cuts if c <= len(reply)])
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert final == content and streamed == content
    assert [r[1:] for r in rebuilt] == [[c.name, c.arguments] for c in got]


@pytest.mark.parametrize(("fmt", "reply"), [
    ("hermes", 'Sure. <tool_call>\n{"name": "get_weather", "argum'),  # cut inside the call
    ("hermes", "<tool_call>\nnot json at all\n</tool_call>"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": [1, 2]}]'),  # arguments not an object
    ("generic", '{"tool_call":{"name":"get_weather","arguments":{"city":"Par'),
    ("generic", "plain text, no JSON"),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"'),
])
def test_invalid_or_partial_call_text_comes_back_as_content(fmt, reply, caplog):
    got, content, streamed, _ = parse(fmt, reply)
    assert got == []
    assert content == reply  # never lost
    if fmt != "generic" or reply.startswith("{"):
        assert "tool call text was not valid; returned as content" in caplog.text


@pytest.mark.parametrize(("fmt", "reply"), [
    ("generic", '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_time","argu'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_ti'),
])
@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(0, 120), max_size=8))
def test_a_reply_cut_after_complete_calls_keeps_them(fmt, reply, cuts):
    """A reply that ends by itself (a stop sequence) inside the second of several calls: the
    complete call is kept, whole or streamed (a stream has sent it already), the unfinished one
    dropped."""
    got, content, streamed, rebuilt = parse(fmt, reply, [c for c in cuts if c <= len(reply)])
    assert [(c.name, json.loads(c.arguments)) for c in got] == [("get_weather", {"city": "Oslo"})]
    assert content == "" and streamed == ""
    # a stream sent the kept call whole; of the unfinished one at most its opening pieces went out
    # (streamed deltas cannot be taken back), and the final message no longer lists it
    assert rebuilt[0][1:] == [got[0].name, got[0].arguments]
    assert all(r[1] == "get_time" for r in rebuilt[1:]) and len(rebuilt) <= 2


@pytest.mark.parametrize(("fmt", "reply", "content", "cut"), [
    ("hermes", 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "Sure.",
     ("get_weather", '{"city": "Pa')),
    ("hermes", 'Sure. <tool_call>\n{"name": "get_wea', "Sure. ", None),  # no name yet: nothing to return
    ("hermes", "Sure. <tool_", "Sure. ", None),  # a marker's first characters are not content
    ("generic", '{"tool_call":{"name":"get_weather","arguments":{"city":"Par', "", ("get_weather", '{"city":"Par')),
    ("generic", '{"tool_ca', "", None),
    ("generic", '{"response', "", None),
    ("generic", '{"response":"It is sun', "It is sun", None),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"', "", ("get_weather", '{"city": "Paris"')),
    ("generic", '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_time","argu', "",
     ("get_time", "")),
])
@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(0, 80), max_size=6))
def test_a_reply_the_budget_cuts_inside_a_call(fmt, reply, content, cut, cuts):
    """max_tokens ends the reply inside a call: its markup never becomes content; the call, once its
    name is written, is `cut_call` with the arguments written so far (as OpenAI and llama-server
    return it), exactly what a stream sent of it; complete calls before it are kept."""
    parser = ToolCallParser(FORMATS[fmt].syntax)
    got, final, streamed, rebuilt = parse(fmt, reply, [c for c in cuts if c <= len(reply)], budget_cut=True,
                                          parser=parser)
    assert final == content and streamed.strip() == content.strip()
    assert (None if parser.cut_call is None else (parser.cut_call.name, parser.cut_call.arguments)) == cut
    calls = [*got, *([] if parser.cut_call is None else [parser.cut_call])]
    assert [tuple(r) for r in rebuilt] == [(c.id, c.name, c.arguments) for c in calls]


@pytest.mark.parametrize(("raw", "value"), [
    ('{"city":"Pa', {}), ('{"a":1,"b":"x', {"a": 1}), ('{"a":{"b":2,"c"', {"a": {"b": 2}}),
    ('{"a":[1,2],"b":', {"a": [1, 2]}), ('{"a":"x,}y"', {"a": "x,}y"}), ("", {}), ('{"a":"b"}', {"a": "b"}),
])
def test_cut_arguments_keep_the_members_written_whole(raw, value):
    """The Anthropic dialect's `input` of a call max_tokens cut: what a streaming client's partial parse reads."""
    assert partial_object(raw) == value


def test_content_around_native_calls_is_kept():
    reply = 'I will check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\nDone.'
    got, content, _, _ = parse("hermes", reply)
    assert [c.name for c in got] == ["get_time"]
    assert content == "I will check.\n\nDone."
    text_only = 'The tag <tool_ is not a call, and {"a": 1} is just JSON.'
    assert parse("hermes", text_only)[:2] == ([], text_only)
    assert parse("llama3", "Plain answer.")[:2] == ([], "Plain answer.")


def test_arguments_written_as_a_json_string_are_decoded():
    got, *_ = parse("hermes", '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>')
    assert got[0].arguments == '{"tz": "UTC"}'


def test_mistral_history_ids_are_mapped_to_nine_characters():
    tmpl = template("mistralai-Mistral-Nemo-Instruct-2407")
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": CALLS[:1]},
               {"role": "tool", "content": "rain", "tool_call_id": "call_a1", "name": "get_weather"},
               {"role": "assistant", "content": "It rains."},
               {"role": "user", "content": "Thanks"}]
    text = render(tmpl, request(history))  # the template raises unless ids are 9 alphanumerics
    call_id = text.split('"id": "')[1][:9]
    assert f'"call_id": "{call_id}"' in text and call_id.isalnum()


# --- grammar specs ---

def test_grammar_specs_per_tool_choice():
    user = [{"role": "user", "content": "hi"}]
    generic, hermes, mistral, llama = (FORMATS[n] for n in ("generic", "hermes", "mistral", "llama3"))
    assert tool_grammar(hermes, request(user)) is None  # auto, native: parsed, not forced
    assert tool_grammar(generic, request(user, choice="none")) is None
    auto = tool_grammar(generic, request(user))
    keys = [next(iter(o["properties"])) for o in auto["schema"]["anyOf"]]
    assert keys == ["tool_call", "tool_calls", "response"]
    assert [next(iter(o["properties"])) for o in
            tool_grammar(generic, request(user, parallel=False))["schema"]["anyOf"]] == ["tool_call", "response"]
    named = tool_grammar(generic, request(user, choice="function", name="get_time"))
    assert named["schema"]["properties"]["tool_call"]["properties"]["name"] == {"const": "get_time"}
    required = tool_grammar(hermes, request(user, choice="required", parallel=False))
    assert required["type"] == "repeat" and required["min"] == 1 and required["max"] == 1
    assert tool_grammar(hermes, request(user, choice="required"))["max"] is None
    mis = tool_grammar(mistral, request(user, choice="function", name="get_weather"))
    assert mis["items"][0] == grammar.literal("[TOOL_CALLS]") and mis["items"][1]["schema"]["maxItems"] == 1
    lla = tool_grammar(llama, request(user, choice="required"))
    assert "parameters" in lla["item"]["schema"]["anyOf"][0]["properties"]
    for spec in (auto, named, required, mis, lla):
        grammar.validate(spec)


ANSWER = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}, "next": {"$ref": "#/$defs/step"}},
          "required": ["verdict"], "additionalProperties": False,
          "$defs": {"step": {"type": "string", "maxLength": 5}}}


def test_auto_with_a_response_format_allows_calls_or_the_answer(tok):
    """tool_choice "auto" and a response_format (the OpenAI Agents SDK's output type beside its tools):
    the grammar takes a call or the answer's JSON and nothing else, in the generic format and the
    native ones alike (the answer's own `$ref`s still resolve inside it)."""
    user = [{"role": "user", "content": "hi"}]
    req = dataclasses.replace(request(user, parallel=False), response_format=ResponseFormat("json_schema", ANSWER))
    generic = tool_grammar(FORMATS["generic"], req)
    hermes = tool_grammar(FORMATS["hermes"], req)
    assert hermes["type"] == "alt" and hermes["items"][0]["schema"]["$id"] == "urn:swarmllm:answer"
    cases = [
        (generic, '{"response":{"verdict":"no","next":"go"}}', True),
        (generic, '{"tool_call":{"name":"get_time","arguments":{"tz":"UTC"}}}', True),
        (generic, '{"response":"no"}', False),  # a free-text answer is not the schema's
        (generic, '{"response":{"verdict":"no","next":"too long"}}', False),  # the $ref'd maxLength holds
        (hermes, '{"verdict":"yes"}', True),
        (hermes, '<tool_call>\n{"name":"get_time","arguments":{"tz":"UTC"}}\n</tool_call>', True),
        (hermes, "Sure, here you go.", False),
    ]
    for spec, text, ok in cases:
        grammar.validate(spec)
        assert accepts(tok, spec, text) == ok, (spec["type"], text)
    assert tool_grammar(FORMATS["hermes"], request(user)) is None  # no response_format: parsed, not forced
    prompt = generic_system_prompt(req)
    assert '"response":{..}' in prompt and '"verdict"' in prompt


LLAMA_ANSWERS = [  # (reply, calls): Llama 3 writes calls as bare objects, and so is an answer
    ('{"name": "Science Fair", "date": "Friday", "participants": ["Alice"]}', []),  # OpenAI's CalendarEvent
    ('{"verdict": "yes"}', []),
    ('{"names": ["a"]}', []),
    ('{"name": "get_time", "parameters": {"tz": "UTC"}}', [("get_time", {"tz": "UTC"})]),
    ('<|python_tag|>{"name": "get_time", "parameters": {}}', [("get_time", {})]),
]


@pytest.mark.parametrize(("reply", "calls"), LLAMA_ANSWERS)
@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(0, 80), max_size=8))
def test_llama3_tells_an_answer_from_a_call(reply, calls, cuts):
    """tool_choice "auto" with a response_format on a Llama 3 model: a bare object is a call only when
    it opens as one of an offered tool; any other object is the answer, streamed as content as it is
    written (until 2026-12-06 an answer with a `name` came back as a call of a tool that does not
    exist, and any other answer was held back to the end and logged as an invalid call)."""
    user = [{"role": "user", "content": "hi"}]
    req = dataclasses.replace(request(user), response_format=ResponseFormat("json_schema", ANSWER))
    parser = new_parser(FORMATS["llama3"], req)
    got, content, streamed, rebuilt = parse("llama3", reply, [c for c in cuts if c <= len(reply)], parser=parser)
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    if not calls:
        assert content == streamed == reply and not rebuilt
        assert not parser.failed  # not taken for a broken call (that logged a warning)
    # without a response_format the old reading stands: a bare object with a name is a call
    assert not new_parser(FORMATS["llama3"], request(user))._answers


@pytest.mark.parametrize("reply", ['{"na', '{"name": "Science Fa', '{"name": "get_ti'])
def test_llama3_an_answer_cut_before_it_could_tell_is_content(reply):
    """max_tokens ends the reply while its start could still be a call's (found in review: the text
    was dropped, content empty): it is the answer as far as it was written."""
    user = [{"role": "user", "content": "hi"}]
    req = dataclasses.replace(request(user), response_format=ResponseFormat("json_schema", ANSWER))
    got, content, streamed, _ = parse("llama3", reply, parser=new_parser(FORMATS["llama3"], req), budget_cut=True)
    assert got == [] and content == streamed == reply


def test_an_answer_streams_before_it_ends():
    user = [{"role": "user", "content": "hi"}]
    req = dataclasses.replace(request(user), response_format=ResponseFormat("json_schema", ANSWER))
    parser = new_parser(FORMATS["llama3"], req)
    assert parser.feed('{"verd') == ('{"verd', [])  # not `{"name"`: the answer, sent as it comes
    other = new_parser(FORMATS["llama3"], req)
    assert other.feed('{"name": "Sci') == ('{"name": "Sci', [])  # no offered tool's name starts so


def accepts(tok, spec, text: str) -> bool:
    """The grammar allows `text` token by token and may end after it."""
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec))
    for token in tok.tokenize(text, add_bos=False, special=True):
        if not c.allowed()[token]:
            return False
        c.accept(token)
    return bool(c.allowed()[c.eog_ids].any())


TREE = ToolSpec("plant", "A tree of names", {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {"name": {"type": "string"}, "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}},
                   "kind": {"$ref": "#/definitions/kind"}},
    "definitions": {"kind": {"enum": ["oak", "elm"]}}})


def test_a_tool_that_refers_into_its_parameters_gets_an_id_of_its_own():
    """"#" and "#/definitions/..." mean the tool's parameters: references resolve against the nearest
    `$id`, so in every format's grammar the parameters carry one (a tool without references, or
    with its own `$id`, is left as it is)."""
    user = [{"role": "user", "content": "hi"}]
    own = ToolSpec("own", "", {**TREE.parameters, "$id": "https://example.com/tree.json"})
    for name in ("generic", "hermes", "mistral", "llama3"):
        spec = tool_grammar(FORMATS[name], request(user, choice="required", tools=(TREE, WEATHER, own)))
        grammar.validate(spec)
        ids = [s.get("$id") for root in _schemas(spec) for s in _parameters(root)]
        want = ["urn:swarmllm:tool:0", None, "https://example.com/tree.json"]
        assert ids and ids == want * (len(ids) // 3), (name, ids)  # generic: one call and a list of calls


def _parameters(schema):
    """The parameter schemas of the calls in a grammar root's schema (in tool order)."""
    if isinstance(schema, dict):
        props = schema.get("properties", {})
        if "name" in props and set(props) & {"arguments", "parameters"}:
            yield props.get("arguments", props.get("parameters"))
            return
        for v in schema.values():
            yield from _parameters(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from _parameters(v)


def _schemas(spec):
    """Every JSON schema at a json_value root of a grammar spec."""
    if isinstance(spec, dict):
        if spec.get("type") == "json":
            yield spec["schema"]
        for v in spec.values():
            yield from _schemas(v)
    elif isinstance(spec, list | tuple):
        for v in spec:
            yield from _schemas(v)


def test_an_unfinished_object_is_told_from_malformed_text():
    from node.inference.tools import unfinished_object

    for raw in ('{', ' {"city"', '{"city": "Pa', '{"a": [1, {"b": tr', '{"a": "x\\'):
        assert unfinished_object(raw), raw
    for raw in ('', 'x', '{x}', '{"a": 1}', '[1', '{"a": 1}}', '{"a": "x"]'):
        assert not unfinished_object(raw), raw


def test_an_invalid_call_logs_the_replys_text_only_at_debug(caplog):
    """The warning of an invalid call quoted 200 characters of the model's reply (the user's own words
    echoed, tool arguments) into every node.log at the default level (found 2026-12-06): the warning
    now says how long it was; the text is at -v (DEBUG) only."""
    reply = "<tool_call>\nnot json SECRET-WORDS-7 at all\n</tool_call>"
    with caplog.at_level(logging.INFO):
        parse("hermes", reply)
    assert "tool call text was not valid" in caplog.text and "SECRET-WORDS-7" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        parse("hermes", reply)
    assert "SECRET-WORDS-7" in caplog.text

