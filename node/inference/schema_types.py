"""What pydantic writes for its standard types, made into JSON schema llguidance can hold.

A response model with a `set[str]`, a `Path`, `bytes`, a `SecretStr`, an `IPvAnyAddress` or a
`UUID4` field gets `uniqueItems` or a format of pydantic's own in its schema, and instructor,
LangChain, pydantic-ai, LiteLLM and the openai SDK's `parse()` send that schema as it is: each was
a 400 "constrained decoding does not support" (2026-12-07). Each format below becomes one that
admits the values pydantic itself accepts for the type; other unknown formats stay a 400, and so do
`file-path` and `directory-path` (FilePath, DirectoryPath: pydantic checks the path exists on the
client's disk, which no grammar can, so a reply would fail there and a client retry for ever;
review r44). `uniqueItems` is not enforced, as llama.cpp's grammar and this node's tool grammars
(compiled lenient) do not: a reply may repeat an item, which pydantic's set/frozenset drop as they
read and another validator may refuse (review r44: said here and in ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then", "else")

# any string is a value of these for pydantic: Path / NewPath, SecretStr / SecretBytes, bytes (read as UTF-8)
ANY_STRING_FORMATS = frozenset({"path", "password", "binary"})
_HEX = "[0-9a-fA-F]"
# pydantic checks the version digit of UUID1..UUID5 (and RFC 4122's variant bits)
_UUID_VERSION = {f"uuid{v}": f"^{_HEX}{{8}}-{_HEX}{{4}}-{v}{_HEX}{{3}}-[89abAB]{_HEX}{{3}}-{_HEX}{{12}}$"
                 for v in range(1, 6)}
_BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # Base64Bytes (Base64Str: also UTF-8)


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    # set[...] / frozenset[...]: a grammar cannot hold it (llama.cpp's json-schema-to-grammar
    # ignores it too); pydantic drops a repeated item when it reads the list (not enforced: above)
    out.pop("uniqueItems", None)
    fmt = out.get("format")
    if not isinstance(fmt, str):
        return out
    if fmt in ANY_STRING_FORMATS:
        del out["format"]
    elif fmt == "ipvanyaddress" and "anyOf" not in out:
        del out["format"]
        out["anyOf"] = [{"format": "ipv4"}, {"format": "ipv6"}]
    elif fmt in _UUID_VERSION or fmt == "base64":
        del out["format"]
        out.setdefault("pattern", _BASE64 if fmt == "base64" else _UUID_VERSION[fmt])
    return out


def each_subschema(schema: Any, fn: Callable[[dict[str, Any]], dict[str, Any]], depth: int = 0) -> Any:
    """The schema with `fn` applied to it and to every subschema in it (a copy; 64 levels at most)."""
    if not isinstance(schema, dict) or depth > 64:
        return schema
    out = dict(fn(schema))  # (a copy: the caller's schema is never changed in place; review r48)
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: each_subschema(v, fn, depth + 1) for k, v in out[key].items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [each_subschema(v, fn, depth + 1) for v in out[key]]
    for key in SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = each_subschema(out[key], fn, depth + 1)
    return out


def pydantic_types(schema: Any) -> Any:
    """The schema with pydantic's `uniqueItems` dropped and its own formats made plain strings or
    patterns (see the module docstring), at every depth; anything else as it was."""
    return each_subschema(schema, _plain)
