"""Integers of at most 19 digits in constrained JSON: a weak model otherwise writes digit after digit
until max_tokens, and the reply is cut JSON that no client parses (the default model did so for 3
replies in 4 to a schema with an unbounded `int`: instructor, LangChain, pydantic-ai and LiteLLM
retried or failed; 2026-12-07). llama.cpp's json-schema-to-grammar allows 16 digits; 9e18 (exact as
a double, within int64) keeps 19-digit ids (Discord/Twitter snowflakes, nanosecond timestamps)
writable (review r44: the 16-digit cap cut them silently). A bound the schema gives on a side is
kept (one below -9e18, which llguidance cannot compile, narrowed to it), none is added that would
clash with it (past the cap, INT64_MAX), and `const`/`enum` schemas are left as they are (their values
bound them); replies stay valid against the client's schema (they are a subset of it). What cannot be
held is a 400 naming it (UnholdableInteger; review r45): a `const`/`enum` integer beyond ±2**53 came
back rounded, and a range wholly below -9e18, or a client bound past the cap, was llguidance's
"Failed to generate regex for integer range".
"""

from __future__ import annotations

from typing import Any

from node.inference.schema_types import each_subschema

MAX_INTEGER = 9 * 10**18  # 19 digits
INT64_MAX = 2**63 - 1  # an upper bound llguidance compiles; no lower one below about -9.2e18 compiles
EXACT_INTEGER = 2**53  # llguidance reads a schema's numbers as doubles: beyond this an integer moves


class UnholdableInteger(ValueError):
    """An integer in the schema that constrained decoding cannot hold (review r45): a `const` or
    `enum` value beyond ±2**53 (written back rounded: a client's id silently another), or a range
    wholly below -9e18 (llguidance cannot compile one)."""


def _too_big(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > EXACT_INTEGER


def _exact(schema: dict[str, Any]) -> None:
    values = [schema["const"]] if "const" in schema else []
    values += schema["enum"] if isinstance(schema.get("enum"), list) else []
    if big := next((v for v in values if _too_big(v)), None):
        raise UnholdableInteger(f"the JSON schema's integer {big} is beyond ±2**53, which constrained decoding "
                                "cannot write exactly (it would come back rounded)")


def _is_integer(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)


def _given(schema: dict[str, Any], *keys: str) -> float | None:
    values = [v for k in keys if isinstance(v := schema.get(k), int | float) and not isinstance(v, bool)]
    return values[0] if values else None


def _bound(schema: dict[str, Any]) -> dict[str, Any]:
    _exact(schema)
    if not _is_integer(schema) or "const" in schema or "enum" in schema:
        return schema
    out = dict(schema)
    low, high = _given(schema, "minimum", "exclusiveMinimum"), _given(schema, "maximum", "exclusiveMaximum")
    if high is not None and high <= -MAX_INTEGER:
        raise UnholdableInteger(f"the JSON schema's integers below {high} cannot be held by constrained decoding "
                                f"(it holds integers from -{MAX_INTEGER})")
    # a side the client bounded is theirs (narrowed only where llguidance cannot compile it: the
    # replies stay within it); the other is added where it cannot clash with it
    if low is None or low < -MAX_INTEGER:
        out.pop("exclusiveMinimum", None)
        out["minimum"] = -MAX_INTEGER
    if high is None:
        out["maximum"] = MAX_INTEGER if low is None or low < MAX_INTEGER else INT64_MAX
    return out


def bounded_integers(schema: Any) -> Any:
    """The schema with every integer given a 19-digit bound (MAX_INTEGER) on a side it leaves open;
    UnholdableInteger for one it cannot hold."""
    return each_subschema(schema, _bound)
