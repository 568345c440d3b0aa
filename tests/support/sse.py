"""Reading the API's server-sent events (`text/event-stream`), whole or as they arrive.

The node writes one `data: <json>` line per event and a blank line after it, then `data: [DONE]`.
These helpers follow the SSE rules that matter for that: `data:` with or without its space, several
data lines of one event joined by newlines, comment lines (`:`) and other fields skipped.
"""

from __future__ import annotations

import json

import aiohttp

DONE = "[DONE]"


class _Events:
    """Accumulates SSE lines into event data payloads."""

    def __init__(self) -> None:
        self._data: list[str] | None = None

    def feed(self, line: str) -> str | None:
        """One line (without its end of line); the finished event's data when `line` ends one."""
        if not line:
            data, self._data = self._data, None
            return "\n".join(data) if data is not None else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data = [*(self._data or []), value[1:] if value.startswith(" ") else value]
        return None

    def end(self) -> str | None:
        """The last event when the body ends without its blank line."""
        return self.feed("")


def sse_data(body: str) -> list[str]:
    """The data payload of every event of a whole SSE body, in order (the final "[DONE]" included)."""
    events, out = _Events(), []
    for line in body.splitlines():
        data = events.feed(line)
        if data is not None:
            out.append(data)
    last = events.end()
    return out if last is None else [*out, last]


class SseStream:
    """`async for data in SseStream(resp)`: each event's data payload as it arrives on an aiohttp
    response (a class, not an async generator, so breaking out of the loop leaves nothing to finalize)."""

    def __init__(self, resp: aiohttp.ClientResponse):
        self._content = resp.content
        self._events = _Events()
        self._ended = False

    def __aiter__(self) -> SseStream:
        return self

    async def __anext__(self) -> str:
        while not self._ended:
            raw = await self._content.readline()
            if not raw:
                self._ended = True
                data = self._events.end()
            else:
                data = self._events.feed(raw.decode("utf-8").rstrip("\r\n"))
            if data is not None:
                return data
        raise StopAsyncIteration


class SseJson(SseStream):
    """`async for event in SseJson(resp)`: each JSON event as a dict; "[DONE]" ends the iteration."""

    async def __anext__(self) -> dict:
        data = await super().__anext__()
        if data == DONE:
            raise StopAsyncIteration
        return json.loads(data)


def delta_text(event: dict) -> str:
    """The text an OpenAI stream chunk adds (chat `delta.content` or completion `text`), all choices."""
    return "".join((ch.get("delta") or {}).get("content") or ch.get("text") or "" for ch in event.get("choices", []))


def finish_reasons(event: dict) -> list[str]:
    """The finish reasons an OpenAI stream chunk carries (usually none, one on the last chunk)."""
    return [ch["finish_reason"] for ch in event.get("choices", []) if ch.get("finish_reason")]
