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
