"""Responses kept on the node for `previous_response_id` and GET /v1/responses/{id}.

A bounded LRU (count and bytes, node.const RESPONSE_STORE_*) with expiry; each entry holds the
response body and the whole conversation that produced it (prior turns, this input, this output),
as internal messages, so continuing a conversation is one lookup. Instructions are not part of it
(OpenAI: they do not carry over to the next response). In memory only: a restart forgets them.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass
from typing import Any

from node import const


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its body and the conversation up to and including its output."""

    body: dict[str, Any]
    messages: tuple[dict, ...]
    expires: float  # time.monotonic()
    size: int  # bytes counted against the store's limit


def _text_len(value: Any) -> int:
    """The length of the strings in a body's output items (a few nodes each: Responses carry no
    logprobs) plus a little for each node."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + 4 + _text_len(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_len(v) + 2 for v in value)
    return 8


def _size(body: dict[str, Any], messages: tuple[dict, ...]) -> int:
    """Bytes counted against the store's limit, near the body's JSON size, without encoding the reply
    on the loop (a long reply's whole body was dumped here once only to be measured; 2026-12-06): the
    body but its output is small (the request's echoed options, tools), the output is measured."""
    n = len(json.dumps({k: v for k, v in body.items() if k != "output"}, ensure_ascii=False))
    n += _text_len(body.get("output") or [])
    for msg in messages:
        n += len(msg.get("content") or "") + 32
        for call in msg.get("tool_calls") or ():
            n += len(call.id) + len(call.name) + len(call.arguments)
    return n


class ResponseStore:
    """In-memory LRU of stored responses; loop-only (no locking)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._items: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, body: dict[str, Any], messages: tuple[dict, ...]) -> None:
        """Store (or replace) a response; drops expired and least recently used entries to fit."""
        self.pop(response_id)
        entry = StoredResponse(body, messages, self._clock() + const.RESPONSE_STORE_TTL_S, _size(body, messages))
        if entry.size > const.RESPONSE_STORE_MAX_BYTES:
            return  # larger than the whole store: kept nowhere
        self._items[response_id] = entry
        self.bytes += entry.size
        self._expire()
        while len(self._items) > const.RESPONSE_STORE_MAX or self.bytes > const.RESPONSE_STORE_MAX_BYTES:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.size

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, unless unknown or expired; a hit makes it the most recently used."""
        self._expire()
        entry = self._items.get(response_id)
        if entry is not None:
            self._items.move_to_end(response_id)
        return entry

    def pop(self, response_id: str) -> StoredResponse | None:
        """Remove one entry (None if absent)."""
        entry = self._items.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, e in self._items.items() if e.expires <= now]:
            self.pop(key)
