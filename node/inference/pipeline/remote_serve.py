"""The holder side of remote generate: GENERATE in, llama.cpp on the model held whole, TOKENS out.

A node serving a model whole with llama.cpp runs generations for coordinators elsewhere in the
swarm: through its ModelManager, as a local request would (the model's queue and lock, on-demand
load, the engine's executor, a GenerationJob + TokenChannel), streaming the token ids back in the
batches the channel hands over, then a last TOKENS frame with the end. It sends an empty TOKENS
when it has had nothing to send for GENERATE_KEEPALIVE_S (queued, loading, a long prefill), so the
coordinator can tell a slow holder from a stalled one. GENERATE_CANCEL, or the coordinator's link
dropping, stops the generation at its next token and releases the model's lock.

It runs only what it holds whole and never forwards a GENERATE: a request cannot loop through the
swarm. It refuses, with a TOKENS error end naming a code (or an ERROR frame when the GENERATE has no
usable session id): `malformed_generate`, `coordinator_mismatch`, `duplicate_session`,
`sampling_unsupported` (the sampling dict names a field or grammar type this version lacks: a newer
coordinator's, which tries another holder), `not_contributing` (paused), `model_not_held_whole`, `model_load_failed` (its vocabulary could not be read; a failed
load that still stands is the same error end from its task, before it queues), `model_unavailable`, `context_exceeded`,
`overloaded`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node import const
from node.errors import (
    ModelUnavailable,
    NodeError,
    Overloaded,
    PeerUnreachable,
    ProtocolError,
    SamplingUnsupported,
)
from node.inference.handoff import GenerationJob, TokenChannel, batch_scores
from node.inference.manager import ModelManager
from node.inference.pipeline.peer_requests import PeerRequestServer
from node.inference.pipeline.remote_wire import Generate, GenerateCancel, Tokens, sid_of
from node.inference.pipeline.transport import PipelineTransport
from node.inference.served import ServedModel
from node.logs import kv
from node.net import ErrorInfo, FrameType

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Generation:
    """One generation this node runs for a coordinator."""

    gen: Generate
    job: GenerationJob
    served: ServedModel
    received: float
    task: asyncio.Task | None = None
    queued: bool = True  # counted in the model's `waiting` (from admission until it holds the lock)
    finished: bool = False  # _finish ran (it runs once, from the task's end or its done-callback)
    generating: bool = False  # the engine has it (a cancel then stops it at its next token)
    cancelled: bool = False  # nobody listens any more: send nothing
    why: str | None = None  # why it was cancelled (in the `finished` line)
    sent: int = 0  # tokens sent so far
    last_sent: float = 0.0
    keepalive: asyncio.TimerHandle | None = None
    end: str = "cancelled"


class RemoteGenerateServer(PeerRequestServer):
    """Serves GENERATE and GENERATE_CANCEL for the models this node holds whole."""

    REQUEST, CANCEL = FrameType.GENERATE, FrameType.GENERATE_CANCEL

    def __init__(self, node_id: str, models: ModelManager, transport: PipelineTransport, peers: Any | None,
                 contributing: Callable[[], bool] = lambda: True):
        super().__init__(node_id, models, transport, peers, contributing)
        self.tokens = 0  # tokens sent to others
        self.coordinators: set[str] = set()  # short ids of the nodes served (diagnostics)

    # --- frames in ----------------------------------------------------------------------------

    def on_generate(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """A GENERATE (loop thread, arrival order): refuse it at once, or start its task."""
        sid = sid_of(header)
        try:  # the ids are checked in _check, once the prompt is known to fit the model's context
            gen = Generate.from_frame(header, payload, check_ids=False)
        except SamplingUnsupported as exc:  # a newer coordinator's field: it tries another holder
            self._refuse(sender, sid, exc.code, f"node {self.node_id[:8]} {exc.message}")
            return
        except ProtocolError as exc:
            self._refuse(sender, sid, "malformed_generate", exc.message)
            return
        served = next((m for m in self.models.whole_models() if m.entry.sha256 == gen.model), None)
        refusal = self._check(gen, served, sender)
        if refusal is not None:
            self._refuse(sender, gen.sid, *refusal)
            return
        assert served is not None
        room = served.n_ctx - len(gen.prompt)
        job = GenerationJob(gen.sid, gen.tokens(), gen.sampling, min(gen.max_new_tokens, room),
                            history=gen.generated())
        g = _Generation(gen, job, served, time.monotonic())
        g.last_sent = g.received
        # queued from now: the next GENERATE's admission counts it, even in the same read of the link
        self.models.mark(served, waiting=+1)
        self.running[(sender, gen.sid)] = g
        if len(self.coordinators) < const.SERVED_COORDINATORS_MAX:
            self.coordinators.add(sender[:8])
        # DEBUG: the holder's one INFO line per generation is `remote generate finished`
        log.debug("DIAG: remote generate started %s", kv(
            sid=gen.sid, coordinator=sender[:8], model=served.id, prompt_tokens=len(gen.prompt),
            max_new=job.max_new_tokens))
        loop = asyncio.get_running_loop()
        g.keepalive = loop.call_later(const.GENERATE_KEEPALIVE_S, self._keepalive, g)
        g.task = asyncio.create_task(self._run(g, served), name=f"remote-generate-{gen.sid}")
        # a task cancelled before its first step never runs its body (nor its finally): this does
        g.task.add_done_callback(lambda _task: self._finish(g))

    def _check(self, gen: Generate, served: ServedModel | None, sender: str) -> tuple[str, str] | None:
        """(code, message) when this GENERATE must be refused, else None."""
        me = self.node_id[:8]
        if gen.coordinator != sender:
            return "coordinator_mismatch", f"GENERATE names coordinator {gen.coordinator[:8]} but came from {sender[:8]}"
        if (sender, gen.sid) in self.running:
            return "duplicate_session", f"session {gen.sid} is already running on {me}"
        if not self.contributing():
            return "not_contributing", f"node {me} has paused contributing to the swarm"
        if served is None:
            return "model_not_held_whole", f"node {me} does not serve model {gen.model[:12]} whole"
        if served.tokenizer is None:  # (a failed load with a vocabulary: the task refuses it, or loads a
            err = self.models.unservable(served)  # changed file, as for a local request; a stat is not for the loop)
            return err.code or "model_unavailable", f"{err.message} (on {me})"
        if len(gen.prompt) >= served.n_ctx:  # before any token is looked at: n is up to MAX_PROMPT_TOKENS
            return "context_exceeded", (f"the prompt is {len(gen.prompt)} tokens; model {served.id} runs with a "
                                        f"context of {served.n_ctx} on {me}")
        if (bad := gen.outside_vocabulary(served.tokenizer.n_vocab)) is not None:
            return "malformed_generate", f"prompt token id {bad} is outside the vocabulary of {served.id}"
        try:
            self.models.admit(served)
        except Overloaded as exc:
            return "overloaded", exc.message
        return None

    on_request = on_generate

    def on_cancel(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """The coordinator stopped listening: stop that generation at its next token."""
        try:
            ctl = GenerateCancel.from_header(header)
        except ProtocolError as exc:
            log.warning("DIAG: malformed GENERATE_CANCEL dropped %s", kv(sender=sender[:8], error=exc.message))
            return
        g = self.running.get((sender, ctl.sid))
        if g is not None:
            self._stop(g, "cancelled by the coordinator")

    def end_model(self, served: ServedModel, why: str) -> int:
        """A forced unload: every generation of `served` here, running or queued for the model's
        lock, ends now with a `model_unavailable` error end (its coordinator fails over at once),
        rather than a queued one taking the lock before the unload and running its course while
        the unload waits for it. Returns how many."""
        ended = [g for g in self.running.values() if g.served is served and not g.cancelled]
        for g in ended:
            self._send(g, Tokens(g.gen.sid, g.sent, end="error", error_code=ModelUnavailable.code, error=why))
            self._stop(g, why)
        return len(ended)

    def _stop(self, g: _Generation, why: str) -> None:
        if g.cancelled:
            return
        g.cancelled, g.why = True, why
        g.job.cancel.set()  # the engine stops at its next token
        log.debug("DIAG: remote generate cancelled %s", kv(sid=g.gen.sid, coordinator=g.gen.coordinator[:8],
                                                          tokens=g.sent, why=why))
        if not g.generating and g.task is not None:
            g.task.cancel()  # still queued for the model's lock or loading it

    # --- running ------------------------------------------------------------------------------

    async def _run(self, g: _Generation, served: ServedModel) -> None:
        models, job = self.models, g.job
        loop = asyncio.get_running_loop()
        holding, gen_future = False, None
        try:
            await models.async_refuse_failed(served)  # a failed load's reason, unless its file changed since
            await served.lock.acquire()
            holding, g.queued = True, False
            served.running.add(job)
            models.mark(served, waiting=-1, busy=True)
            await models.async_load_on_demand(served, sid=g.gen.sid)
            await models.async_check_file(served)  # a file cut while loaded: refused, not SIGBUS
            engine, tok = served.engine, served.tokenizer
            if engine is None or tok is None:
                raise ModelUnavailable(f"model {served.id} was unloaded while the generation was starting")
            if job.cancel.is_set():
                return
            channel = TokenChannel(loop)
            g.generating = True
            last = time.monotonic()
            gen_future = asyncio.ensure_future(engine.async_generate(job, channel, tok.is_eog, tok))
            last_token = None
            async for batch in channel.batches():
                now = time.monotonic()
                self._send(g, Tokens(g.gen.sid, g.sent, tuple(batch), eval_us=int((now - last) * 1e6),
                                     scores=tuple(batch_scores(batch) or ())))
                last, last_token = now, batch[-1]
            g.end = ("eog" if last_token is not None and tok.is_eog(last_token)
                     else "cancelled" if job.cancel.is_set() else "length")
            self._send(g, Tokens(g.gen.sid, g.sent, end=g.end))
        except asyncio.CancelledError:
            g.end = "cancelled"
            raise
        except NodeError as exc:
            g.end = "error"
            self._send(g, Tokens(g.gen.sid, g.sent, end="error", error_code=exc.code or "error", error=exc.message))
        except Exception as exc:  # an engine bug must not take the node down; the coordinator fails over
            log.exception("remote generate failed sid=%s", g.gen.sid)
            g.end = "error"
            self._send(g, Tokens(g.gen.sid, g.sent, end="error", error_code="internal_error",
                                 error=f"{type(exc).__name__}: {exc}"))
        finally:
            job.cancel.set()
            if gen_future is not None:
                try:
                    await asyncio.shield(gen_future)
                except BaseException:  # noqa: BLE001 - its error was reported through the channel
                    pass
            if holding:
                served.running.discard(job)
                served.lock.release()
                models.mark(served, busy=False)
            self._finish(g)

    def _finish(self, g: _Generation) -> None:
        """The generation is over (idempotent: its task's end, then its done-callback)."""
        if g.finished:
            return
        g.finished = True
        if g.queued:  # it never held the lock (cancelled while queued, or before its task started)
            g.queued = False
            self.models.mark(g.served, waiting=-1)
        if g.keepalive is not None:
            g.keepalive.cancel()
            g.keepalive = None
        self.running.pop((g.gen.coordinator, g.gen.sid), None)
        self.served += 1
        self.tokens += g.sent
        log.info("DIAG: remote generate finished %s", kv(
            sid=g.gen.sid, coordinator=g.gen.coordinator[:8], tokens=g.sent, reason=g.end, why=g.why,
            total_ms=round((time.monotonic() - g.received) * 1000, 1)))

    def _keepalive(self, g: _Generation) -> None:
        """Loop timer: an empty TOKENS when nothing has been sent for a while."""
        if g.cancelled or (g.gen.coordinator, g.gen.sid) not in self.running:
            return
        if time.monotonic() - g.last_sent >= const.GENERATE_KEEPALIVE_S / 2:
            self._send(g, Tokens(g.gen.sid, g.sent))
        g.keepalive = asyncio.get_running_loop().call_later(const.GENERATE_KEEPALIVE_S, self._keepalive, g)

    def _send(self, g: _Generation, msg: Tokens) -> None:
        if g.cancelled:
            return
        try:
            self.transport.send(g.gen.coordinator, FrameType.TOKENS, msg.to_header(), msg.payload())
        except PeerUnreachable:
            self._stop(g, "the coordinator is unreachable")
            return
        g.last_sent = time.monotonic()
        g.sent += len(msg.tokens)

    def _refuse(self, sender: str, sid: str | None, code: str, message: str) -> None:
        """Tell the sender why its GENERATE will not run (TOKENS error end, or ERROR without a sid)."""
        log.warning("DIAG: remote generate refused %s", kv(sender=sender[:8], sid=sid, code=code, error=message))
        try:
            if sid is None:
                self.transport.send(sender, FrameType.ERROR, ErrorInfo(code, message).to_header())
            else:
                msg = Tokens(sid, 0, end="error", error_code=code, error=message)
                self.transport.send(sender, FrameType.TOKENS, msg.to_header())
        except PeerUnreachable:
            pass
