"""A reply a stop sequence ends inside a tool call (ToolCallParser.in_call, cut_short): cut as the token
budget cuts it, and a whole call it ends after stays a call (reviews r76, r78, r79, r80)."""

from __future__ import annotations

from node.inference.request import ToolCall
from node.inference.tools import FORMATS, ToolCallParser


def test_in_call_is_a_tool_call_only_not_a_json_answer_nor_an_answers_wrapper():
    """Review r76: a stop sequence cuts a reply `in_call` as the token budget does. It was any region:
    a Llama 3 reply's JSON answer ({"result": ...}, or a "name" no tool has) was cut as a call and
    lost, and Cohere's answer wrapper held back a closer's first characters of the answer."""
    from node.inference.tools.cohere import RESPONSE_OPEN

    def fed(syntax, text: str, **kw) -> ToolCallParser:
        parser = ToolCallParser(syntax, known=("get_weather",), **kw)
        parser.feed(text)
        return parser
    llama, generic, hermes = FORMATS["llama3"].syntax, FORMATS["generic"].syntax, FORMATS["hermes"].syntax
    assert not fed(llama, '{"result": 42, "note": "the ').in_call
    assert fed(llama, '{"name": "get_weather", "parameters": {"city": "Pa').in_call
    # review r78: a call not named yet is one, and so is one the stream sent as a call (any name)
    assert fed(llama, '{"name": "get_').in_call and fed(llama, '{"name": "lookup", "parameters": {"q": "P').in_call
    assert fed(generic, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Pa').in_call
    assert fed(generic, '{"tool_call":{"name":"get_').in_call and fed(generic, '{"tool_calls": [').in_call
    assert not fed(generic, '{"response": "the answer is ').in_call
    assert fed(hermes, '<tool_call>\n{"name": "get_we').in_call  # (a marker opened it: a call however far)
    assert not fed(FORMATS["cohere"].syntax, "The answer is x <", opened=RESPONSE_OPEN).in_call


def test_a_stop_sequence_cutting_a_later_call_is_no_tool_use_for_anthropic():
    """Review r76: a stop sequence inside the second of two calls gave stop_reason tool_use (the first
    call was whole), so an agent loop ran the cut call with its arguments missing."""
    from types import SimpleNamespace

    from node.api.anthropic_reply import stop_reason

    whole = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    cut = ToolCall("call_2", "get_weather", '{"city": "')
    trace = SimpleNamespace(finish_reason="stop", finish_detail="stop_sequence")
    assert stop_reason(SimpleNamespace(trace=trace, tool_calls=[whole], cut_call=cut, stopped_in_call=True)) \
        == "stop_sequence"
    # r78: a later call cut before its name (dropped: no cut_call) is no tool_use either
    assert stop_reason(SimpleNamespace(trace=trace, tool_calls=[whole], cut_call=None, stopped_in_call=True)) \
        == "stop_sequence"
    assert stop_reason(SimpleNamespace(trace=trace, tool_calls=[whole], cut_call=None, stopped_in_call=False)) \
        == "tool_use"


def test_a_whole_call_a_stop_sequence_ends_before_its_region_closes_is_still_a_call():
    """Review r79: a stop sequence matching after a whole call but before its region closed (Hermes'
    `</tool_call>`, a newline after Llama 3's object, the generic list's `]`) counted as "inside a
    call": finish_reason stop and stop_reason stop_sequence, so an agent loop left the call unrun.
    Only a call the cut left unfinished (or dropped) is a cut (`cut_short`)."""
    cases = [("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'),
             ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
             ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]')]
    for fmt, text in cases:
        parser = ToolCallParser(FORMATS[fmt].syntax, known=("get_weather",))
        parser.feed(text)
        assert parser.in_call, fmt
        parser.finish(cut=True)
        assert [c.name for c in parser.calls] == ["get_weather"] and parser.cut_call is None, fmt
        assert not parser.cut_short, fmt
    parser = ToolCallParser(FORMATS["hermes"].syntax, known=("get_weather",))
    parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    parser.finish(cut=True)
    assert parser.cut_short and parser.cut_call is not None and parser.calls == []
    # review r80: a second call opened after a whole one, nothing of it read yet, is cut short too
    whole = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    for fmt, later in (("hermes", "<tool_call>\n"), ("qwen_xml", "<tool_call>\n<function=look")):
        parser = ToolCallParser(FORMATS[fmt].syntax, known=("get_weather", "lookup"))
        parser.feed((whole if fmt == "hermes" else
                     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                     "</tool_call>\n") + later)
        assert parser.in_call, fmt
        parser.finish(cut=True)
        assert [c.name for c in parser.calls] == ["get_weather"] and parser.cut_short, fmt
