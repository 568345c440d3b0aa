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

import math
from typing import Any

from node.inference.schema_types import each_subschema

MAX_INTEGER = 9 * 10**18  # 19 digits
INT64_MAX = 2**63 - 1  # an upper bound llguidance compiles; no lower one below about -9.2e18 compiles
EXACT_INTEGER = 2**53  # llguidance reads a schema's numbers as doubles: beyond this an integer moves


class UnholdableNumber(ValueError):
    """A number in the schema that constrained decoding cannot hold (a 400 naming it)."""


class UnholdableInteger(UnholdableNumber):
    """An integer in the schema that constrained decoding cannot hold (review r45): a `const` or
    `enum` value beyond ±2**53 (written back rounded: a client's id silently another), or a range
    wholly below -9e18 (llguidance cannot compile one)."""


def _too_big(value: Any, integer: bool = True) -> bool:
    """An integer llguidance cannot hold exactly: an int beyond ±2**53, or, where an integer is
    meant, a float of an integer's value beyond it (1e20: clamped to INT64_MAX; review r48)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > EXACT_INTEGER
    return integer and isinstance(value, float) and value.is_integer() and abs(value) > EXACT_INTEGER


def _shown(value: float) -> str:
    """A number as the client wrote it (an int exactly: through a float it was another; review r49)."""
    return str(value) if isinstance(value, int) or not value.is_integer() else f"{value:.0f}"


def _null_only(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null" and len(schema) == 1


def _unholdable_only(schema: Any) -> bool:
    """A branch whose `const`, or every `enum` value, is an integer it cannot hold."""
    if not isinstance(schema, dict):
        return False
    integer = _is_integer(schema)
    if "const" in schema:
        return _too_big(schema["const"], integer)
    values = schema.get("enum")
    return isinstance(values, list) and bool(values) and all(_too_big(v, integer) for v in values)


def _exact(schema: dict[str, Any], lenient: bool) -> dict[str, Any]:
    """`schema`, or UnholdableInteger for a `const`/`enum` integer beyond ±2**53. A lenient schema
    (a tool's: one tool a grammar cannot hold must not fail every request that lists it, review r47)
    loses those values instead, narrowed as far as it can be: an `anyOf`/`oneOf` branch of them goes
    when others but `null` remain (review r49: an optional id was only ever null), an `enum` keeps the
    values it can hold, and a schema left with none becomes the integers between them (any integer
    when they lie beyond int64; review r48: `{}`, any value, came back)."""
    integer = _is_integer(schema)  # (a float const of a number schema is held as the double it is)
    out = schema
    for key in ("anyOf", "oneOf"):
        branches = out.get(key)
        if lenient and isinstance(branches, list) and any(map(_unholdable_only, branches)):
            kept = [b for b in branches if not _unholdable_only(b)]
            if kept and not all(map(_null_only, kept)):
                out = {**out, key: kept}
    big = [out["const"]] if "const" in out and _too_big(out["const"], integer) else []
    big += [v for v in out["enum"] if _too_big(v, integer)] if isinstance(out.get("enum"), list) else []
    if not big:
        return out
    if not lenient:
        raise UnholdableInteger(f"the JSON schema's integer {_shown(big[0])} is beyond ±2**53, which constrained "
                                "decoding cannot write exactly (it would come back rounded)")
    out = {k: v for k, v in out.items() if k != "const"}
    kept = [v for v in out.get("enum") or [] if not _too_big(v, integer)]
    if kept and any(v is not None for v in kept):
        return {**out, "enum": kept}
    out.pop("enum", None)  # (only null left: the id too, as the integers between; review r50)
    kind = out.get("type") if isinstance(out.get("type"), list) else "integer"
    if kept and kind == "integer":
        kind = ["integer", "null"]
    low, high = max(min(big), -MAX_INTEGER), min(max(big), INT64_MAX)
    return {**out, "type": kind, **({"minimum": low, "maximum": high} if low <= high else {})}


def _is_integer(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)


def _number(schema: dict[str, Any], key: str) -> float | None:
    v = schema.get(key)
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


U32_MAX = 2**32 - 1


def _holdable_step(step: float) -> bool:
    """Whether llguidance can compile `multipleOf: step`: it writes it as coef * 10**-exp with coef a
    u32, found by multiplying by 10 until the double has no fraction (1e-11 ends at 9999999999999998).
    Not finite: no (a peer's WORK frame may hold NaN or Infinity, which `nan % 1` never ends: the slice's
    one thread spun for good, review r55); a double has no fraction after ~330 rounds."""
    if not math.isfinite(step):
        return False
    for _ in range(400):
        if not step % 1:
            break
        step *= 10
    return step <= U32_MAX


def _step(schema: dict[str, Any], lenient: bool) -> dict[str, Any]:
    """`schema`, or UnholdableNumber for a positive `multipleOf` llguidance cannot compile (1e-11 and
    finer, more than 10 significant digits, or past 2**32: "too many digits", a 400 for every
    request listing a tool that had one); a lenient schema loses it instead (2026-12-07)."""
    step = _number(schema, "multipleOf")
    if step is None or step <= 0 or _holdable_step(step):
        return schema
    if not lenient:
        raise UnholdableNumber(f"the JSON schema's `multipleOf: {_shown(step)}` is beyond what constrained decoding "
                               "holds (a step of coef * 10**-n with coef below 2**32, down to 1e-10)")
    return {k: v for k, v in schema.items() if k != "multipleOf"}


def _bound(schema: dict[str, Any], lenient: bool) -> dict[str, Any]:
    schema = _exact(_step(schema, lenient), lenient)
    if not _is_integer(schema) or "const" in schema or "enum" in schema:
        return schema
    out = dict(schema)
    # bounds llguidance cannot compile: an upper one below -9e18, a lower one above INT64_MAX;
    # a lenient schema loses them (review r48: still a 400 for every request listing the tool)
    # (an exclusive bound at the limit leaves nothing either: review r50)
    unholdable = {"maximum": lambda v: v < -MAX_INTEGER, "exclusiveMaximum": lambda v: v <= -MAX_INTEGER,
                  "minimum": lambda v: v > INT64_MAX, "exclusiveMinimum": lambda v: v >= INT64_MAX}
    for keys in (("maximum", "exclusiveMaximum"), ("minimum", "exclusiveMinimum")):
        for key in keys:
            if (v := _number(out, key)) is not None and unholdable[key](v):
                if not lenient:
                    raise UnholdableInteger(f"the JSON schema's integer bound `{key}: {_shown(v)}` is beyond what "
                                            f"constrained decoding holds (integers from -{MAX_INTEGER} to {INT64_MAX})")
                del out[key]
    lows = [v for k in ("minimum", "exclusiveMinimum") if (v := _number(out, k)) is not None]
    highs = [v for k in ("maximum", "exclusiveMaximum") if (v := _number(out, k)) is not None]
    low, high = max(lows, default=None), min(highs, default=None)  # the bounds in force
    # a side the client bounded is theirs; a lower bound llguidance cannot compile (below -9e18) is
    # dropped, only that key (review r47: an exclusiveMinimum beside it was dropped too), the open
    # side added where it cannot clash; the replies stay within the client's bounds
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


SECOND_FRACTION_DIGITS = 9  # nanoseconds (Go's RFC3339Nano, Java's Instant); llama.cpp writes 3
# at most one fraction, of 1 to 9 digits, in a date-time or a time (llguidance's own format regex
# checks the rest): its format allows `\.[0-9]+`, and a weak model wrote "11.1234567…" until max_tokens
_SECONDS_PATTERN = rf"^[^.]*(\.[0-9]{{1,{SECOND_FRACTION_DIGITS}}}([^0-9.][^.]*)?)?$"


def _bound_seconds(schema: dict[str, Any]) -> dict[str, Any]:
    if schema.get("format") in ("date-time", "time") and "pattern" not in schema:
        return {**schema, "pattern": _SECONDS_PATTERN}  # (a pattern the client gave is theirs)
    return schema


def bounded_seconds(schema: Any) -> Any:
    """The schema with every `date-time` and `time` string's fraction of a second bounded to
    SECOND_FRACTION_DIGITS digits (a pattern beside the format; one the client gave is left alone)."""
    return each_subschema(schema, _bound_seconds)
