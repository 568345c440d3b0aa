"""The asking side of remote embeddings: a model this node does not hold whole, embedded by a peer
that does.

The holder is chosen as remote generate chooses one (the planner's cheapest whole holder among
the peers that advertise the model whole and do not pause contributing; measured ms per token
first, advertised after). The inputs (tokenized and checked here) go in one EMBED; the holder
answers with keepalives, then the float32 vectors (embed_serve.py). A holder silent for
GENERATE_SILENCE_S + its ACK budget, whose link drops, or that ends with a node-side error is
left out and the next one is asked (MAX_ASSEMBLIES attempts); a client error it reports (an input
too long for its context, `dimensions`) is the client's answer, as a local request's would be.
Every holder refusing `overloaded` is a 429; none left, a 503 naming who failed and how.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from node import const
from node.errors import (
    ContextLengthExceeded,
    InsufficientCapacity,
    InvalidRequest,
    NodeError,
    Overloaded,
    PeerUnreachable,
    ProtocolError,
)
from node.inference.pipeline.deadlines import StepDeadlines
from node.inference.pipeline.embed_wire import Embed, EmbedCancel, Embedded
from node.inference.pipeline.holders import LayerHolders
from node.inference.pipeline.planner import Holder, plan_route
from node.inference.pipeline.remote_wire import sid_of
from node.inference.pipeline.transport import PipelineTransport
from node.inference.served import ServedModel
from node.logs import kv
from node.net import FrameType
from node.trace import RequestTrace, SegmentTrace

log = logging.getLogger(__name__)

# the holder's error codes that are the request's own fault: the client gets them, nobody is retried
_CLIENT_ERRORS: dict[str, type[NodeError]] = {ContextLengthExceeded.code: ContextLengthExceeded,
                                              InvalidRequest.code: InvalidRequest}


class _Failed(Exception):
    def __init__(self, node_id: str, cause: str, message: str):
        super().__init__(message)
        self.node_id, self.cause, self.message = node_id, cause, message


class RemoteEmbedder:
    """Sends EMBED for this node's API and routes the EMBEDDED replies to the waiting request."""

    def __init__(self, node_id: str, transport: PipelineTransport, peers: Any | None, holders: LayerHolders,
                 deadlines: StepDeadlines):
        self.node_id = node_id
        self.transport = transport
        self.peers = peers
        self.holders = holders
        self.deadlines = deadlines
        self.waiting: dict[str, tuple[str, asyncio.Queue]] = {}  # sid -> (holder, its replies)
        self._unsubscribe: list[Callable[[], None]] = []
        transport.on_local(FrameType.EMBEDDED, self.on_embedded)

    def register(self) -> None:
        self.transport.register_remote(FrameType.EMBEDDED)
        if self.peers is not None:
            self._unsubscribe.append(self.peers.subscribe(self._on_peer_event))
            lacks = getattr(self.peers, "lacks", None)
            if lacks is not None:
                self._unsubscribe.append(lacks.subscribe(self._on_unsupported))

    def close(self) -> None:
        while self._unsubscribe:
            self._unsubscribe.pop()()

    def _whole(self, sha256: str) -> list[Holder]:
        return [h for h in self.holders.holders(sha256) if h.whole and h.node_id != self.node_id]

    def _lacks_embed(self, node_id: str) -> bool:
        """Whether that peer's process refused EMBED as an unknown frame type (a version before
        remote embeddings, 2026-12-06): not asked for embeddings until it restarts."""
        lacks = getattr(self.peers, "lacks", None)
        return lacks is not None and lacks.lacks(node_id, FrameType.EMBED)

    def _on_unsupported(self, node_id: str, frame_type: int | None) -> None:
        """A peer refused a frame type as unknown: when it is EMBED, or unnamed (a peer before
        2026-12-07) while an EMBED waits on it that it has not shown it serves (PeerLacks.refuses),
        every EMBED waiting on it fails now (an old peer's silence would last GENERATE_SILENCE_S)."""
        waiting = [replies for holder, replies in self.waiting.values() if holder == node_id]
        if not self.peers.lacks.refuses(node_id, frame_type, FrameType.EMBED, bool(waiting)):
            return
        for replies in waiting:
            replies.put_nowait(_Failed(node_id, "old_version", f"{node_id[:8]}'s version has no remote "
                                       "embeddings (it refused EMBED as an unknown frame type): update it"))

    def has_holder(self, sha256: str) -> bool:
        """Whether some peer holds the model whole and contributes now."""
        return bool(self._whole(sha256))

    def on_embedded(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        sid = sid_of(header) or ""
        waiting = self.waiting.get(sid)
        if waiting is None or waiting[0] != sender:
            log.debug("DIAG: No pending request for EMBEDDED — ended, cancelled, or old attempt %s",
                      kv(sid=sid, node=sender[:8]))
            return
        lacks = getattr(self.peers, "lacks", None)
        if lacks is not None:
            lacks.note_knows(sender, FrameType.EMBED)  # an unnamed unsupported_frame_type is not about EMBED
        try:
            waiting[1].put_nowait(Embedded.from_frame(header, payload))
        except ProtocolError as exc:
            log.warning("DIAG: malformed EMBEDDED %s", kv(sender=sender[:8], error=exc.message))
            waiting[1].put_nowait(_Failed(sender, "protocol", f"malformed EMBEDDED: {exc.message}"))

    def _on_peer_event(self, kind: str, snap: Any) -> None:
        if kind == "removed" or snap.state != "connected":
            for holder, replies in self.waiting.values():
                if holder == snap.node_id:
                    replies.put_nowait(_Failed(holder, "link_drop", f"link to {snap.short_id} dropped ({snap.state})"))

    async def async_embed(self, served: ServedModel, token_lists: list[list[int]], dimensions: int | None,
                          trace: RequestTrace, truncated: bool = False) -> np.ndarray:
        """The vectors from a peer holding the model whole, failing over between holders: in one
        EMBED, or (inputs over one EMBED's bounds) in parts one after the other. `truncated`: the
        client asked for its inputs to be cut to fit (cut here, to this node's limit): a holder
        with a smaller context refusing one as too long is left out, not the client's answer."""
        trace.mark_dequeued()  # nothing queues here: the holder's queue is in its keepalives' time
        widths = _widths(served, dimensions)
        parts = _parts(token_lists, max(widths, default=None))
        if len(parts) == 1:
            return await self._embed_part(served, token_lists, dimensions, widths, trace, trace.request_id,
                                          _Scope(0, len(token_lists), truncated))
        vectors = [await self._embed_part(served, token_lists[a:b], dimensions, widths, trace,
                                          f"{trace.request_id}/p{n}", _Scope(a, len(token_lists), truncated))
                   for n, (a, b) in enumerate(parts)]
        return await asyncio.get_running_loop().run_in_executor(None, np.concatenate, vectors)

    async def _embed_part(self, served: ServedModel, token_lists: list[list[int]], dimensions: int | None,
                          widths: set[int], trace: RequestTrace, name: str, scope: _Scope) -> np.ndarray:
        """One EMBED's worth of inputs, failing over between holders (sids `name`/attempt)."""
        entry = served.entry
        # the ids as one int32 array, made once for every attempt, off the loop (~75 ms a 1M ids)
        base = await asyncio.get_running_loop().run_in_executor(
            None, Embed.of, f"{name}/0", entry.sha256, token_lists, self.node_id, dimensions)
        excluded: set[str] = set()
        overloaded: str | None = None
        last: str | None = None
        for attempt in range(1, const.MAX_ASSEMBLIES + 1):
            started = trace.begin_assembly()
            try:
                load = collections.Counter(h for h, _ in self.waiting.values())
                whole = self._whole(entry.sha256)
                old = sorted(h.node_id[:8] for h in whole if self._lacks_embed(h.node_id))
                holders = [h if not load.get(h.node_id) else _dearer(h, load[h.node_id])
                           for h in whole if not self._lacks_embed(h.node_id)]
                plan = plan_route(entry.n_layers, holders, exclude=frozenset(excluded), standbys=False)
            except InsufficientCapacity as exc:
                trace.end_assembly(started)
                if overloaded is not None:
                    raise Overloaded(overloaded) from exc
                if old and not excluded - {h.node_id for h in whole if self._lacks_embed(h.node_id)}:
                    raise InsufficientCapacity(
                        f"the peers holding model {served.id} whole ({', '.join(old)}) run a version without "
                        "remote embeddings: update them, or load the model whole on this node") from exc
                if last is not None:
                    raise InsufficientCapacity(f"no peer holding model {served.id} whole could embed the inputs; "
                                               f"left out after failing this request: "
                                               f"{', '.join(sorted(n[:8] for n in excluded))} (last: {last})") from exc
                raise InsufficientCapacity(f"no peer holds model {served.id} whole now") from exc
            holder = plan.segments[0]
            kind = self.transport.kind(holder.node_id)
            trace.end_assembly(started, [SegmentTrace(holder.short_id, 0, entry.n_layers, kind)])
            trace.route = "relayed" if kind == "relayed" else "distributed"
            trace.regions = [holder.region] if holder.region else []
            log.log(logging.INFO if attempt > 1 else logging.DEBUG, "DIAG: pipeline assembled %s", kv(
                request_id=trace.request_id, attempt=attempt, segments=plan.describe(), operation="embeddings",
                schedule_ms=round((time.monotonic() - started) * 1000, 2)))
            sid = f"{name}/{attempt}"
            try:
                msg = await self._ask(sid, holder.node_id, dataclasses.replace(base, sid=sid), widths, scope)
            except _Failed as failure:
                excluded.add(failure.node_id)
                last = f"{failure.node_id[:8]} {failure.cause}: {failure.message}"
                if failure.cause == Overloaded.code:
                    overloaded = failure.message
                trace.note_failure(failure.cause, failure.message)
                log.warning("DIAG: remote embeddings attempt failed %s", kv(
                    request_id=trace.request_id, attempt=attempt, node=failure.node_id[:8], cause=failure.cause,
                    error=failure.message))
                continue
            if trace.segments:
                trace.segments[0].elapsed_ms += msg.eval_us / 1000
            assert msg.vectors is not None
            return msg.vectors  # float32 (inputs x width): the API makes its JSON off the loop
        if overloaded is not None:
            raise Overloaded(overloaded)
        raise InsufficientCapacity(f"remote embeddings failed {const.MAX_ASSEMBLIES} times; last: {last}")

    async def _ask(self, sid: str, holder: str, req: Embed, widths: set[int],
                   scope: _Scope | None = None) -> Embedded:
        """One attempt: EMBED to `holder`, its final EMBEDDED (ok: one vector per input, each of
        the `widths` known), or _Failed naming why (also when it keeps sending keepalives past
        EMBED_REMOTE_MAX_WAIT_S)."""
        scope = scope or _Scope(0, req.n_inputs, False)
        replies: asyncio.Queue = asyncio.Queue()
        self.waiting[sid] = (holder, replies)
        silence = const.GENERATE_SILENCE_S + self.deadlines.ack_budget(holder)
        give_up = time.monotonic() + const.EMBED_REMOTE_MAX_WAIT_S
        done = False
        try:
            try:
                self.transport.send(holder, FrameType.EMBED, req.to_header(), req.payload())
            except PeerUnreachable as exc:
                raise _Failed(holder, "unreachable", exc.message) from exc
            while True:
                left = give_up - time.monotonic()
                try:
                    msg = await asyncio.wait_for(replies.get(), min(silence, max(0.0, left)))
                except TimeoutError:
                    if left <= silence:
                        raise _Failed(holder, "deadline", f"{holder[:8]} sent no vectors in "
                                      f"{const.EMBED_REMOTE_MAX_WAIT_S:.0f} s") from None
                    raise _Failed(holder, "deadline", f"{holder[:8]} sent nothing for {silence:.1f} s") from None
                if isinstance(msg, _Failed):
                    raise msg
                if msg.end is None:
                    continue  # a keepalive
                done = True
                if msg.end == "ok":
                    problem = _bad_vectors(msg, req.n_inputs, widths)
                    if problem is not None:
                        raise _Failed(holder, "protocol", problem)
                    return msg
                client = _CLIENT_ERRORS.get(msg.error_code or "")
                if client is ContextLengthExceeded and scope.truncated:
                    raise _Failed(holder, msg.error_code or "error", f"its context is smaller than this node's, "
                                  f"to which the inputs were cut: {msg.error}")
                if client is not None:
                    raise client(scope.rebase(msg.error or "the holder refused the inputs"), param=msg.param)
                raise _Failed(holder, msg.error_code or "error", msg.error or "the holder ended the request")
        finally:
            self.waiting.pop(sid, None)
            if not done and not self._lacks_embed(holder):  # cancelled, failed or silent: it must not go on
                try:
                    self.transport.send(holder, FrameType.EMBED_CANCEL, EmbedCancel(sid).to_header())
                except PeerUnreachable:
                    pass


@dataclasses.dataclass(frozen=True)
class _Scope:
    """Where one EMBED's inputs lie in the client's request: a holder names them from 0."""

    offset: int  # the client's index of the part's first input
    n_client: int  # inputs in the client's request
    truncated: bool  # the client asked for `truncate`

    def rebase(self, message: str) -> str:
        """A holder's message naming `input` / `input[i]` of its part, as the client's index."""
        if self.n_client == 1:
            return message
        message = _INPUT_AT.sub(lambda m: f"`input[{int(m.group(1)) + self.offset}]`", message)
        return message.replace("`input`", f"`input[{self.offset}]`")


_INPUT_AT = re.compile(r"`input\[(\d+)\]`")


def _parts(token_lists: list[list[int]], width: int | None) -> list[tuple[int, int]]:
    """The inputs as consecutive [a, b) ranges, each within one EMBED's bounds: at most
    EMBED_REMOTE_MAX_INPUTS inputs and EMBED_REMOTE_MAX_TOKENS tokens, and a reply (b - a) x width
    x 4 of at most EMBED_REMOTE_MAX_REPLY_BYTES (a holder refuses more; each input fits alone)."""
    most = const.EMBED_REMOTE_MAX_INPUTS
    if width:
        most = max(1, min(most, const.EMBED_REMOTE_MAX_REPLY_BYTES // (4 * width)))
    parts: list[tuple[int, int]] = []
    start = tokens = 0
    for i, ids in enumerate(token_lists):
        if i > start and (i - start >= most or tokens + len(ids) > const.EMBED_REMOTE_MAX_TOKENS):
            parts.append((start, i))
            start, tokens = i, 0
        tokens += len(ids)
    parts.append((start, len(token_lists)))
    return parts


def _widths(served: ServedModel, dimensions: int | None) -> set[int]:
    """The width every vector must have: the model's embedding_length (its GGUF header) and the
    client's `dimensions` if set (both, when both are known: a holder answers only its model's own
    width, and a client asking another one gets the holder's 400)."""
    n_embd = served.entry.header.arch_get("embedding_length")
    return {w for w in (n_embd, dimensions) if isinstance(w, int) and w > 0}


def _bad_vectors(msg: Embedded, n_inputs: int, widths: set[int]) -> str | None:
    """Why an ok EMBEDDED cannot be the answer (a holder answering other shapes is broken or
    hostile: its reply is refused before any float becomes a Python object), or None."""
    vectors = msg.vectors
    if vectors is None or vectors.shape[0] != n_inputs:
        return f"EMBEDDED carries {0 if vectors is None else vectors.shape[0]} vectors for {n_inputs} inputs"
    if vectors.nbytes > const.EMBED_REMOTE_MAX_REPLY_BYTES:
        return f"EMBEDDED carries {vectors.nbytes} bytes of vectors; at most {const.EMBED_REMOTE_MAX_REPLY_BYTES}"
    if any(vectors.shape[1] != w for w in widths):
        return (f"EMBEDDED carries vectors of {vectors.shape[1]} floats; "
                f"the request's are {' and '.join(map(str, sorted(widths)))}")
    return None


def _dearer(h: Holder, n: int) -> Holder:
    """A holder this node already waits on n times is CHAIN_LOAD_WEIGHT dearer for each (as chains)."""
    return dataclasses.replace(h, ms_per_layer=h.layer_ms() * (1 + const.CHAIN_LOAD_WEIGHT * n))
