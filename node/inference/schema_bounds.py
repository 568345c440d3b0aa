"""Integers of at most 19 digits in constrained JSON: a weak model otherwise writes digit after digit
until max_tokens, and the reply is cut JSON that no client parses (the default model did so for 3
replies in 4 to a schema with an unbounded `int`: instructor, LangChain, pydantic-ai and LiteLLM
retried or failed; 2026-12-07). llama.cpp's json-schema-to-grammar allows 16 digits; 9e18 (exact as
a double, within int64) keeps 19-digit ids (Discord/Twitter snowflakes, nanosecond timestamps)
writable (review r44: the 16-digit cap cut them silently). A bound the schema gives on a side is
kept, none is added that would clash with it, and `const`/`enum` schemas are left as they are (their
values bound them); replies stay valid against the client's schema (they are a subset of it).
"""

from __future__ import annotations

from typing import Any

from node.inference.schema_types import each_subschema

MAX_INTEGER = 9 * 10**18  # 19 digits (llguidance cannot compile a range to 2**63 - 1)


def _is_integer(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)


def _given(schema: dict[str, Any], *keys: str) -> float | None:
    values = [v for k in keys if isinstance(v := schema.get(k), int | float) and not isinstance(v, bool)]
    return values[0] if values else None


def _bound(schema: dict[str, Any]) -> dict[str, Any]:
    if not _is_integer(schema) or "const" in schema or "enum" in schema:
        return schema
    out = dict(schema)
    low, high = _given(schema, "minimum", "exclusiveMinimum"), _given(schema, "maximum", "exclusiveMaximum")
    # a side the client bounded is theirs; the other is added only where it cannot clash with it
    if "minimum" not in out and "exclusiveMinimum" not in out and (high is None or high > -MAX_INTEGER):
        out["minimum"] = -MAX_INTEGER
    if "maximum" not in out and "exclusiveMaximum" not in out and (low is None or low < MAX_INTEGER):
        out["maximum"] = MAX_INTEGER
    return out


def bounded_integers(schema: Any) -> Any:
    """The schema with every integer given llama.cpp's 16-digit bound on a side it leaves open."""
    return each_subschema(schema, _bound)
