"""Handlers for the frame types other parts of the node serve (WORK, ACK, RESULT, CANCEL, ...).

A coroutine handler runs in its own task (ordered=True: one frame at a time per link, in arrival
order); a plain function runs inline in the link's data_received, with no task and no extra loop
pass. Either returns a reply frame (sent back when the frame was a request) or raises a NodeError
(sent back as ERROR with its code); any other exception is logged and answered `internal_error`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from node.errors import NodeError, PeerUnreachable
from node.logs import kv

from ._frames import FLAG_RESPONSE, Frame, type_name
from ._link import PeerLink

log = logging.getLogger(__name__)

Handler = Callable[[PeerLink, Frame], Awaitable[Frame | None]]
InlineHandler = Callable[[PeerLink, Frame], Frame | None]
Spawn = Callable[[Awaitable[Any]], "asyncio.Task[Any]"]


def _as_reply(request: Frame, reply: Frame) -> Frame:
    if reply.request_id == request.request_id and reply.is_response:
        return reply
    return Frame(reply.type, reply.header, reply.payload, request.request_id, reply.flags | FLAG_RESPONSE)


class Handlers:
    """Registry and runner of frame handlers."""

    def __init__(self, spawn: Spawn):
        self._spawn = spawn
        self._table: dict[int, tuple[Handler | InlineHandler, bool, bool]] = {}  # fn, ordered, is_coro

    def register(self, frame_type: int, handler: Handler | InlineHandler, *, ordered: bool = False) -> None:
        """Serve frames of one type (replaces an earlier handler of that type)."""
        if not callable(handler):
            raise TypeError("handler must be callable")
        self._table[int(frame_type)] = (handler, ordered, inspect.iscoroutinefunction(handler))

    def dispatch(self, link: PeerLink, frame: Frame) -> bool:
        """Run the handler for this frame's type; False if there is none."""
        entry = self._table.get(frame.type)
        if entry is None:
            return False
        handler, ordered, is_coro = entry
        if not is_coro:
            self._run_inline(handler, link, frame)  # type: ignore[arg-type]
            return True
        after = link.order_tails.get(frame.type) if ordered else None
        task = self._spawn(self._async_run(handler, link, frame, after))  # type: ignore[arg-type]
        if ordered:
            link.order_tails[frame.type] = task
        return True

    def _run_inline(self, handler: InlineHandler, link: PeerLink, frame: Frame) -> None:
        try:
            reply = handler(link, frame)
        except NodeError as exc:
            if frame.request_id:
                link.send_error(frame, exc.code or "error", exc.message)
            return
        except Exception as exc:
            log.exception("inline handler for %s from %s failed", type_name(frame.type), link.short_id)
            if frame.request_id:
                link.send_error(frame, "internal_error", f"{type(exc).__name__}: {exc}")
            return
        if reply is not None and frame.request_id and link.is_open:
            link.send_nowait(_as_reply(frame, reply))  # the reader's own write: no back-pressure wait

    async def _async_run(self, handler: Handler, link: PeerLink, frame: Frame,
                         after: asyncio.Task[None] | None) -> None:
        if after is not None and not after.done():
            await asyncio.wait([after])
        try:
            reply = await handler(link, frame)
        except NodeError as exc:
            if frame.request_id:
                link.send_error(frame, exc.code or "error", exc.message)
            else:
                log.info("DIAG: frame handler failed %s", kv(peer_id=link.short_id,
                                                            type=type_name(frame.type), error=exc.message))
            return
        except Exception as exc:
            log.exception("handler for %s from %s failed", type_name(frame.type), link.short_id)
            if frame.request_id:
                link.send_error(frame, "internal_error", f"{type(exc).__name__}: {exc}")
            return
        if reply is not None and frame.request_id and link.is_open:
            try:
                await link.async_send(_as_reply(frame, reply))
            except PeerUnreachable:
                log.debug("DIAG: reply dropped, link closed %s", kv(peer_id=link.short_id))
