"""Big JSON replies encoded off the loop, in pieces, with the bytes json.dumps gives.

A worker thread alone does not free the loop: json.dumps's C encoder holds the GIL for the whole
call, so 11.7 MB of logprobs encoded on a worker still stalled the loop 0.27 s (the watchdog could
not even sample it). Here a long list is encoded a slice at a time, each slice by the C encoder, so
the GIL passes to the loop between slices (every few milliseconds); the pieces join to exactly
`json.dumps(obj)` (default separators, ASCII escapes), the text aiohttp's json_response sends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from node import const

# The characters str.splitlines (so httpx's iter_lines, which the ollama client and httpx-sse read
# with) ends a line at, that json.dumps(ensure_ascii=False) writes raw: NEL, LINE and PARAGRAPH
# SEPARATOR (the rest it escapes). Escaped, the JSON means the same; Ollama's Go encoder does so too.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
_DESCEND_DEPTH = 4  # body -> choices -> choice -> logprobs -> the per-token list, sliced


def dumps_in_pieces(obj: Any, depth: int = _DESCEND_DEPTH) -> Iterator[str]:
    """`json.dumps(obj)` in pieces: dicts with string keys and lists are opened down to `depth`
    levels, a list of scalars (or one below `depth`) longer than JSON_SLICE_ITEMS is encoded that
    many items at a time. A long list of containers is opened item by item while `depth` allows:
    sliced by count, 128 embeddings of 4096 floats were one 10 MB call (0.3-0.6 s of loop stall,
    found in review)."""
    if depth > 0 and isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        yield "{"
        for i, (key, value) in enumerate(obj.items()):
            yield (", " if i else "") + json.dumps(key) + ": "
            yield from dumps_in_pieces(value, depth - 1)
        yield "}"
    elif (isinstance(obj, list | tuple) and len(obj) > const.JSON_SLICE_ITEMS
          and not (depth > 0 and isinstance(obj[0], dict | list | tuple))):  # (containers: opened below)
        yield "["
        for i in range(0, len(obj), const.JSON_SLICE_ITEMS):
            yield (", " if i else "") + json.dumps(obj[i:i + const.JSON_SLICE_ITEMS])[1:-1]
        yield "]"
    elif depth > 0 and isinstance(obj, list | tuple) and obj:
        yield "["
        for i, item in enumerate(obj):
            if i:
                yield ", "
            yield from dumps_in_pieces(item, depth - 1)
        yield "]"
    else:
        yield json.dumps(obj)


def encode(obj: Any) -> bytes:
    """`json.dumps(obj).encode()`, byte for byte, built in pieces (call it on a worker thread)."""
    return "".join(dumps_in_pieces(obj)).encode("utf-8")


def dumps_line(obj: Any) -> str:
    """`obj` as compact JSON for one line of a stream (NDJSON, an SSE `data:`): UTF-8 text kept, but
    no character a line-splitting reader breaks at (a streamed U+2028 cut the ollama client's line in
    two: JSONDecodeError)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)
