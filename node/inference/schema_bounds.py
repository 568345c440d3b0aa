"""Integers of at most 16 digits in constrained JSON, as llama.cpp's json-schema-to-grammar writes
them (`[1-9] [0-9]{0,15}`): a weak model otherwise writes digit after digit until max_tokens, and
the reply is cut JSON that no client parses (the default model did so for 3 replies in 4 to a
schema with an unbounded `int`: instructor, LangChain, pydantic-ai and LiteLLM retried or failed;
2026-12-07). A bound the schema gives on a side is kept; replies stay valid against the client's
schema (they are a subset of it).
"""

from __future__ import annotations

from typing import Any

from node.inference.schema_types import each_subschema

MAX_INTEGER = 10**16 - 1  # 16 digits, llama.cpp's integral-part


def _is_integer(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)


def _bound(schema: dict[str, Any]) -> dict[str, Any]:
    if not _is_integer(schema):
        return schema
    out = dict(schema)
    if "minimum" not in out and "exclusiveMinimum" not in out:
        out["minimum"] = -MAX_INTEGER
    if "maximum" not in out and "exclusiveMaximum" not in out:
        out["maximum"] = MAX_INTEGER
    return out


def bounded_integers(schema: Any) -> Any:
    """The schema with every integer given llama.cpp's 16-digit bound on a side it leaves open."""
    return each_subschema(schema, _bound)
