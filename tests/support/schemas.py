"""Hypothesis strategies for JSON schemas whose every valid value is bounded in length, so a
random-weight model constrained by one always finishes within a known number of tokens."""

from __future__ import annotations

from hypothesis import strategies as st

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
PATTERNS = ["^[a-z]{1,6}$", "^[0-9]{3}-[0-9]{2}$", "^(yes|no|maybe)$", "^[A-Z][a-z]{0,5}$"]
# a JSON string of n characters is at most 6n + 2 bytes (\uXXXX escapes); a token is at least a byte


def _string():
    return st.one_of(
        st.integers(0, 8).map(lambda n: {"type": "string", "maxLength": n}),
        st.sampled_from(PATTERNS).map(lambda p: {"type": "string", "pattern": p}),
    )


def _leaf():
    return st.one_of(
        _string(),
        st.tuples(st.integers(-1000, 1000), st.integers(0, 1000)).map(
            lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.lists(st.one_of(NAMES, st.integers(-50, 50), st.booleans()), min_size=1, max_size=5, unique=True).map(
            lambda values: {"enum": values}),
    )


def _extend(children):
    objects = st.dictionaries(NAMES, children, min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required,
                              "additionalProperties": False}))
    arrays = st.tuples(children, st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "maxItems": t[1]})
    return st.one_of(objects, arrays)


def bounded_schemas():
    """Top-level objects, nested up to a few levels, every length bounded."""
    return st.dictionaries(NAMES, st.recursive(_leaf(), _extend, max_leaves=6), min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required,
                              "additionalProperties": False}))


def max_bytes(schema: dict) -> int:
    """An upper bound on the bytes of any compact JSON value valid against a bounded schema."""
    if "enum" in schema:
        import json

        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        if "maxLength" in schema:
            return 6 * schema["maxLength"] + 2
        return 2 + 6 * 8  # the patterns above match at most 8 characters
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind in ("boolean", "null"):
        return 5
    if kind == "array":
        return 2 + schema["maxItems"] * (max_bytes(schema["items"]) + 1)
    props = schema["properties"]
    return 2 + sum(len(name) * 6 + 3 + max_bytes(sub) + 1 for name, sub in props.items())
