"""Typed checks on JSON values this node did not write: peers' frames and adverts, data-dir files.

`json.loads` gives `True` where an int is expected as readily as `3` (bool is an int in Python), and a
sha256 field may hold anything; each reader used to write these checks again.
"""

from __future__ import annotations

import json
import re
from typing import Any

SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a sha256 as peers and manifests write it


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_or_none(value: Any) -> int | None:
    """`value` when it is an int (not a bool), else None."""
    return value if is_int(value) else None


def is_sha256(value: Any) -> bool:
    """64 lower-case hex digits, as a sha256 is written on the wire and in manifests."""
    return isinstance(value, str) and SHA256_HEX.fullmatch(value) is not None


# Nesting deeper than this is refused before json.loads sees it (serde_json's default limit too): the
# parser recurses once per level, so 50,000 levels hit Python's recursion limit — a RecursionError
# raised wherever the stack happened to be, and a finalizer that a collection ran at that depth failed
# as an "unraisable" error (a CI flake, 2026-12-07). No request or frame this node reads nests past ~20.
MAX_JSON_DEPTH = 128
# A peer's frame header carries a request's grammar spec inside its own levels (sampling, spec nodes,
# the tool grammar's anyOf/properties): deeper than the body it came from. At the body's bound a tool
# schema the coordinator took dropped the link to the peer it was sent to, on every resend (review r58).
PEER_JSON_DEPTH = 2 * MAX_JSON_DEPTH
_ALL_BUT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class NestedTooDeeply(ValueError):
    """JSON text whose arrays and objects nest past MAX_JSON_DEPTH."""


def json_nesting_over(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests arrays/objects deeper than `limit`, found without recursing (brackets
    inside strings do not count). Cheap for most texts: fewer opening brackets than `limit` is a no;
    else the strings are cut out (escapes first) and the brackets left are counted."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else _utf8(bytes(text))
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    outside = b"".join(data.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    depth = 0
    for byte in outside.translate(None, _ALL_BUT_BRACKETS):
        if byte == 91 or byte == 123:  # [ {
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _utf8(data: bytes) -> bytes:
    """JSON bytes as UTF-8: json.loads reads UTF-16 and UTF-32 too (found by their zero bytes), whose
    code units hold `"` and `\\` bytes inside other characters (U+2200 is 00 22): scanned as they are,
    a string seemed to open and the brackets after it went uncounted (review r51). Undecodable: as is
    (json.loads refuses it without recursing)."""
    encoding = json.detect_encoding(data)
    if encoding == "utf-8":
        return data
    try:
        return data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeError:
        return data


def loads_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH, **kwargs: Any) -> Any:
    """json.loads, with nesting past `limit` a NestedTooDeeply (a ValueError) instead of a
    RecursionError from deep inside the parser."""
    if json_nesting_over(text, limit):
        raise NestedTooDeeply(f"JSON nested more than {limit} levels deep")
    try:
        return json.loads(text, **kwargs)
    except RecursionError as exc:  # (a text the count misjudged: still the same ValueError)
        raise NestedTooDeeply(f"JSON nested more than {limit} levels deep") from exc
