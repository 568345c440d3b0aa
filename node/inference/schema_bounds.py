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


def _exact(schema: dict[str, Any], lenient: bool) -> dict[str, Any]:
    """`schema`, or UnholdableInteger for a `const`/`enum` integer beyond ±2**53. A lenient schema
    (a tool's: one tool a grammar cannot hold must not fail every request that lists it, review r47)
    loses those values instead: a `const` whole, an `enum` the values it cannot hold (all of them: the
    `enum` whole)."""
    big = [schema["const"]] if "const" in schema and _too_big(schema["const"]) else []
    big += [v for v in schema["enum"] if _too_big(v)] if isinstance(schema.get("enum"), list) else []
    if not big:
        return schema
    if not lenient:
        raise UnholdableInteger(f"the JSON schema's integer {big[0]} is beyond ±2**53, which constrained decoding "
                                "cannot write exactly (it would come back rounded)")
    out = {k: v for k, v in schema.items() if k != "const" or not _too_big(v)}
    if isinstance(out.get("enum"), list):
        kept = [v for v in out["enum"] if not _too_big(v)]
        if kept:
            out["enum"] = kept
        else:
            del out["enum"]
    return out


def _is_integer(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)


def _number(schema: dict[str, Any], key: str) -> float | None:
    v = schema.get(key)
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _bound(schema: dict[str, Any], lenient: bool) -> dict[str, Any]:
    schema = _exact(schema, lenient)
    if not _is_integer(schema) or "const" in schema or "enum" in schema:
        return schema
    out = dict(schema)
    lows = [v for k in ("minimum", "exclusiveMinimum") if (v := _number(schema, k)) is not None]
    highs = [v for k in ("maximum", "exclusiveMaximum") if (v := _number(schema, k)) is not None]
    low, high = max(lows, default=None), min(highs, default=None)  # the bounds in force
    if high is not None and high <= -MAX_INTEGER:
        if lenient:
            return schema  # (as before: llguidance's own word on it)
        raise UnholdableInteger(f"the JSON schema's integers below {high} cannot be held by constrained decoding "
                                f"(it holds integers from -{MAX_INTEGER})")
    # a side the client bounded is theirs; a lower bound llguidance cannot compile (below -9e18) is
    # narrowed to -MAX_INTEGER, only that key (review r47: an exclusiveMinimum beside it was dropped);
    # the replies stay within the client's bounds. The open side is added where it cannot clash.
    for key in ("minimum", "exclusiveMinimum"):
        if (v := _number(out, key)) is not None and v < -MAX_INTEGER:
            del out[key]
    if _number(out, "minimum") is None and _number(out, "exclusiveMinimum") is None:
        out["minimum"] = -MAX_INTEGER
    if high is None:
        out["maximum"] = MAX_INTEGER if low is None or low < MAX_INTEGER else INT64_MAX
    return out


def bounded_integers(schema: Any, *, lenient: bool = False) -> Any:
    """The schema with every integer given a 19-digit bound (MAX_INTEGER) on a side it leaves open;
    UnholdableInteger for one it cannot hold (`lenient`, a tool's schema: those values dropped)."""
    return each_subschema(schema, lambda sub: _bound(sub, lenient))
