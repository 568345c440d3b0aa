"""JSON nesting is measured before json.loads recurses into it (node/values.py): request bodies,
tool-call arguments, peers' frame headers and preambles all go through `loads_bounded`."""

from __future__ import annotations

import json

import pytest

from node.values import MAX_JSON_DEPTH, NestedTooDeeply, json_nesting_over, loads_bounded


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


@pytest.mark.parametrize("kind", [str, bytes])
def test_the_limit_is_the_depth_of_arrays_and_objects(kind):
    def as_kind(text: str):
        return text if kind is str else text.encode()

    assert loads_bounded(as_kind(nested(MAX_JSON_DEPTH))) == json.loads(nested(MAX_JSON_DEPTH))
    assert not json_nesting_over(as_kind(nested(MAX_JSON_DEPTH)))
    with pytest.raises(NestedTooDeeply):
        loads_bounded(as_kind(nested(MAX_JSON_DEPTH + 1)))
    mixed = '{"a": [' * 64 + "1" + "]}" * 64  # 128 levels, objects and arrays
    assert loads_bounded(as_kind(mixed)) is not None
    with pytest.raises(NestedTooDeeply):
        loads_bounded(as_kind("[" + mixed + "]"))


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"a": "[" * 500 + '\\"{{{' + "]" * 3, "b": ["[[[[\\\\"] * 300})
    assert json_nesting_over(text) is False and json_nesting_over(text.encode()) is False
    assert loads_bounded(text) == json.loads(text)


def test_many_siblings_are_not_depth():
    text = json.dumps([[i] for i in range(10_000)])  # 10,001 opening brackets, 2 levels
    assert json_nesting_over(text) is False and len(loads_bounded(text)) == 10_000


def test_a_million_levels_is_a_value_error_not_a_recursion_error():
    with pytest.raises(ValueError, match="nested more than 128 levels"):
        loads_bounded(nested(1_000_000).encode())


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_json_in_utf16_and_utf32_is_measured_as_json_loads_reads_it(encoding):
    """json.loads reads UTF-16/32 bytes; scanned as UTF-8, a character whose code unit holds a `"`
    byte (U+2200 is 00 22 in UTF-16) opened a "string" and the brackets after it went uncounted: a
    deep one reached the RecursionError, and a shallow one with `\\"` and brackets in a string was
    refused (review r51)."""
    deep = ('{"a": "\u2200\u4e22", "b": ' + nested(5000) + "}").encode(encoding)
    assert json_nesting_over(deep)
    with pytest.raises(NestedTooDeeply):
        loads_bounded(deep)
    shallow = json.dumps({"q": '\\"' + "[" * 300, "r": "\u2200"}, ensure_ascii=False).encode(encoding)
    assert not json_nesting_over(shallow) and loads_bounded(shallow)["r"] == "\u2200"


def test_a_peers_frame_header_may_nest_deeper_than_a_request_body():
    """A WORK frame carries a request's grammar spec inside its own levels (sampling, spec nodes, the
    tool grammar's wrappers): a tool schema the coordinator took at the body's bound made the peer's
    header past it, refused as a malformed frame — the link dropped on every resend (review r58)."""
    from node.errors import ProtocolError
    from node.net._frames import PREFIX, decode_frame
    from node.values import PEER_JSON_DEPTH

    def frame(depth: int) -> bytes:
        header = ('{"a":' * depth + "1" + "}" * depth).encode()
        return PREFIX.pack(b"SWRM", 1, 16, 0, 0, len(header), 0) + header

    assert decode_frame(frame(MAX_JSON_DEPTH + 20)).header["a"]
    with pytest.raises(ProtocolError, match="nested more than"):
        decode_frame(frame(PEER_JSON_DEPTH + 1))


def test_a_tool_schema_nested_past_its_bound_is_one_clear_400():
    """Past ~120 levels jsonschema's own check hit Python's recursion limit (a RecursionError at the
    limit: the kind of failure loads_bounded was made to end) and llguidance's 128-level reader
    refused with "recursion limit exceeded" (review r58); a schema nests at most MAX_SCHEMA_DEPTH."""
    from node.api import tool_schemas

    deep = {"type": "object", "properties": {"a": {"type": "array", "items": {}}}}
    inner = deep["properties"]["a"]
    for _ in range(70):
        inner["items"] = {"type": "array", "items": {}}
        inner = inner["items"]
    assert "nests more than 64 levels" in tool_schemas._schema_error(deep)
    assert tool_schemas._schema_error({"type": "object", "properties": {"a": {"type": "integer"}}}) is None
