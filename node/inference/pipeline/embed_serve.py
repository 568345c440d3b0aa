"""The holder side of remote embeddings: EMBED in, llama.cpp's embedding context on the model held
whole, EMBEDDED out.

A node serving a model whole embeds inputs for nodes that do not hold it: as a local request
would (`embeddings.embed_held`: the model's admission queue and lock, on-demand load, the engine's
executor, runs of EMBED_RUN_TOKENS), sending an empty EMBEDDED every GENERATE_KEEPALIVE_S while it
waits or computes (so the asker tells a slow holder from a stalled one), then the vectors as float32
or an error end. EMBED_CANCEL, or the asker's link dropping, stops the work at its next run and
releases the model's lock. It runs only what it holds whole and never forwards an EMBED.

The cheap checks (the header's counts, the model, the queue) come before the one that reads every
id (the vocabulary, vectorised); ids stay one int32 array until the engine's executor makes each
run's lists, and the vectors become float32 bytes there too: the loop never walks a token or a float.

Refusals (an EMBEDDED error end, or an ERROR frame when there is no usable sid): `malformed_embed`
(every field validated, bounded by EMBED_REMOTE_MAX_INPUTS / _TOKENS), `coordinator_mismatch`,
`duplicate_session`, `not_contributing` (paused), `model_not_held_whole`, `model_load_failed` (the vocabulary could not be read; a failed
load that still stands is the same error end from its task, before it queues),
`reply_too_large` (inputs x n_embd x 4 over EMBED_REMOTE_MAX_REPLY_BYTES), `overloaded` (the
model's queue is full, or EMBED_REMOTE_MAX_PER_ASKER of this peer's EMBEDs run or wait here), and the client errors a local request gets (`context_length_exceeded`,
`invalid_request` with its param), which the asker hands to its client unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from node import const
from node.errors import NodeError, Overloaded, PeerUnreachable, ProtocolError
from node.inference.embeddings import check_ids, embed_held
from node.inference.pipeline.embed_wire import Embed, EmbedCancel, Embedded
from node.inference.pipeline.peer_requests import PeerRequestServer
from node.inference.pipeline.remote_wire import sid_of
from node.inference.served import ServedModel
from node.logs import kv
from node.net import ErrorInfo, FrameType

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    req: Embed
    served: ServedModel
    received: float
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    begun: bool = False  # its task started (else a cancel before its first step is counted out by _ended)
    locked: float | None = None  # when it took the model's lock (then a cancel waits for the current run)
    keepalive: asyncio.TimerHandle | None = None


class RemoteEmbedServer(PeerRequestServer):
    """Serves EMBED and EMBED_CANCEL for the models this node holds whole."""

    REQUEST, CANCEL = FrameType.EMBED, FrameType.EMBED_CANCEL

    def on_embed(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """An EMBED (loop thread): refuse it at once, or start its task."""
        sid = sid_of(header)
        try:
            req = Embed.from_frame(header, payload)
        except ProtocolError as exc:
            self._refuse(sender, sid, "malformed_embed", exc.message)
            return
        served = next((m for m in self.models.whole_models() if m.entry.sha256 == req.model), None)
        try:
            refusal = self._check(req, served, sender)
        except NodeError as exc:  # a client error a local request would get (too long, outside the vocabulary)
            self._refuse(sender, req.sid, exc.code or "invalid_request", exc.message, exc.param)
            return
        if refusal is not None:
            self._refuse(sender, req.sid, *refusal)
            return
        assert served is not None
        job = _Job(req, served, time.monotonic())
        self.models.mark(served, waiting=+1)  # counted at once: a burst in one read is held to the queue cap
        self.running[(sender, req.sid)] = job
        log.info("DIAG: remote embeddings started %s", kv(
            sid=req.sid, coordinator=sender[:8], model=served.id, inputs=req.n_inputs, tokens=req.n_tokens()))
        job.keepalive = asyncio.get_running_loop().call_later(const.GENERATE_KEEPALIVE_S, self._keepalive, job)
        job.task = asyncio.create_task(self._run(job), name=f"remote-embed-{req.sid}")
        job.task.add_done_callback(lambda _task: self._ended(job))

    def _check(self, req: Embed, served: ServedModel | None, sender: str) -> tuple[str, str] | None:
        me = self.node_id[:8]
        if req.coordinator != sender:
            return "coordinator_mismatch", f"EMBED names coordinator {req.coordinator[:8]} but came from {sender[:8]}"
        if (sender, req.sid) in self.running:
            return "duplicate_session", f"session {req.sid} is already running on {me}"
        if not self.contributing():
            return "not_contributing", f"node {me} has paused contributing to the swarm"
        if served is None:
            return "model_not_held_whole", f"node {me} does not serve model {req.model[:12]} whole"
        if served.tokenizer is None:  # (a failed load with a vocabulary: the task refuses it, or loads a
            err = self.models.unservable(served)  # changed file, as for a local request; a stat is not for the loop)
            return err.code or "model_unavailable", f"{err.message} (on {me})"
        n_embd = served.entry.header.arch_get("embedding_length")
        if isinstance(n_embd, int) and req.n_inputs * n_embd * 4 > const.EMBED_REMOTE_MAX_REPLY_BYTES:
            return "reply_too_large", (f"{req.n_inputs} vectors of {n_embd} floats exceed "
                                       f"{const.EMBED_REMOTE_MAX_REPLY_BYTES} bytes in one reply")
        mine = sum(1 for asker, _sid in self.running if asker == sender)
        if mine >= const.EMBED_REMOTE_MAX_PER_ASKER:
            return "overloaded", (f"node {me} already embeds {mine} requests for {sender[:8]}; "
                                  f"at most {const.EMBED_REMOTE_MAX_PER_ASKER} at once from one peer")
        try:
            self.models.admit(served)
        except Overloaded as exc:
            return "overloaded", exc.message
        # last: the only check that reads every id (vectorised, no Python int per id)
        check_ids(req.ids, req.lens, served.n_ctx, served.tokenizer.n_vocab,
                  lambda i: "input" if req.n_inputs == 1 else f"input[{i}]")
        return None

    on_request = on_embed

    def on_cancel(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        try:
            ctl = EmbedCancel.from_header(header)
        except ProtocolError as exc:
            log.warning("DIAG: malformed EMBED_CANCEL dropped %s", kv(sender=sender[:8], error=exc.message))
            return
        job = self.running.get((sender, ctl.sid))
        if job is not None:
            self._stop(job, "cancelled by the coordinator")

    def _stop(self, job: _Job, why: str) -> None:
        if job.cancel.is_set():
            return
        job.cancel.set()  # the next run of inputs does not start; a wait for the lock ends now
        log.info("DIAG: remote embeddings cancelled %s", kv(sid=job.req.sid, coordinator=job.req.coordinator[:8],
                                                            why=why))
        if job.task is not None and job.locked is None:
            job.task.cancel()  # queued for the model's lock or not started: now; else at its next run

    async def _run(self, job: _Job) -> None:
        job.begun = True
        req, served = job.req, job.served
        end = "error"

        def locked() -> None:
            job.locked = time.monotonic()

        try:
            vectors = await embed_held(self.models, served, req.input_ids(), req.dimensions, req.sid,
                                       locked, job.cancel)
            # float32 already (embed_held); its bytes (up to 64 MiB) are copied off the loop too
            payload = await asyncio.get_running_loop().run_in_executor(None, vectors.tobytes)
            array = vectors
            if array.nbytes > const.EMBED_REMOTE_MAX_REPLY_BYTES:
                raise NodeError(f"{len(vectors)} vectors of {array.shape[1]} floats exceed "
                                f"{const.EMBED_REMOTE_MAX_REPLY_BYTES} bytes in one reply", code="reply_too_large")
            eval_us = int((time.monotonic() - job.locked) * 1e6) if job.locked is not None else 0
            self._send(job, Embedded(req.sid, "ok", array, eval_us=eval_us), payload)
            end = "ok"
        except asyncio.CancelledError:
            end = "cancelled"
        except NodeError as exc:
            self._send(job, Embedded(req.sid, "error", error_code=exc.code or "error", error=exc.message,
                                     param=exc.param))
        except Exception as exc:  # an engine bug must not take the node down; the asker fails over
            log.exception("remote embeddings failed sid=%s", req.sid)
            self._send(job, Embedded(req.sid, "error", error_code="internal_error", error=f"{type(exc).__name__}: {exc}"))
        finally:
            self._finish(job, end)

    def _ended(self, job: _Job) -> None:
        """Its task is done: one cancelled before its first step never ran its body (nor embed_held's
        finally, which counts it out of the model's `waiting`)."""
        if not job.begun:
            self.models.mark(job.served, waiting=-1)
            self._finish(job, "cancelled")

    def _finish(self, job: _Job, end: str) -> None:
        req = job.req
        if job.keepalive is not None:
            job.keepalive.cancel()
            job.keepalive = None
        if self.running.pop((req.coordinator, req.sid), None) is None:
            return
        self.served += 1
        log.info("DIAG: remote embeddings finished %s", kv(
            sid=req.sid, coordinator=req.coordinator[:8], inputs=req.n_inputs, end=end,
            total_ms=round((time.monotonic() - job.received) * 1000, 1)))

    def _keepalive(self, job: _Job) -> None:
        if job.cancel.is_set() or (job.req.coordinator, job.req.sid) not in self.running:
            return
        self._send(job, Embedded(job.req.sid))
        job.keepalive = asyncio.get_running_loop().call_later(const.GENERATE_KEEPALIVE_S, self._keepalive, job)

    def _send(self, job: _Job, msg: Embedded, payload: bytes | None = None) -> None:
        """Send `msg` (its vectors' bytes as `payload` when already made off the loop)."""
        if job.cancel.is_set():
            return
        try:
            self.transport.send(job.req.coordinator, FrameType.EMBEDDED, msg.to_header(),
                                msg.payload() if payload is None else payload)
        except PeerUnreachable:
            self._stop(job, "the coordinator is unreachable")

    def _refuse(self, sender: str, sid: str | None, code: str, message: str, param: str | None = None) -> None:
        log.warning("DIAG: remote embeddings refused %s", kv(sender=sender[:8], sid=sid, code=code, error=message))
        try:
            if sid is None:
                self.transport.send(sender, FrameType.ERROR, ErrorInfo(code, message).to_header())
            else:
                msg = Embedded(sid, "error", error_code=code, error=message, param=param)
                self.transport.send(sender, FrameType.EMBEDDED, msg.to_header())
        except PeerUnreachable:
            pass
