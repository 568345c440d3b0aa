"""The segment side of the pipeline: WORK in, this slice's layers, hidden states on to the next hop
(or, on the last segment, a sampled token back to the coordinator). A hop's layers may be any
sub-range of a loaded slice: the slice that already holds the session, else the exact range, else
the smallest one containing it serves it (`SliceHost.containing`).

Frames are handled in arrival order: the synchronous entry point submits the compute to the
slice's single-thread executor before yielding to the loop, so steps of a session run in order.
Every WORK is ACKed to the coordinator with the step's output, marked `done` (or ACK_HOLD_S after
receipt, when the step takes longer): an ACK mid-compute would wake two event loops while the
slice's threads run. A failure becomes a RESULT with an error so the
coordinator learns it at once (a KV position gap names index_pos and kv_len: gotcha #400).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node import const
from node.errors import (
    KvPositionMismatch,
    NodeError,
    Overloaded,
    PeerUnreachable,
    ProtocolError,
    SamplingUnsupported,
)
from node.inference.pipeline.acks import Acks, PendingAck
from node.inference.pipeline.batching import PreparedStep, StepJob, take_batch
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.hosted import HostedSlice
from node.inference.pipeline.sessionctl import ControlBudget, SessionControls
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import (
    HopTelemetry,
    Result,
    Work,
    decode_activations,
    decode_tokens,
    encode_activations,
)
from node.logs import MESSAGE, kv
from node.net import FrameType

if TYPE_CHECKING:  # torch loads with the first slice (torchload.py), not with the worker
    import torch

    from node.inference.pipeline.sampler import Sampler

log = logging.getLogger(__name__)


class SegmentWorker(SessionControls):
    """Serves WORK, CANCEL and SESSION_END for the slices in `host` (session control: sessionctl.py)."""

    def __init__(self, node_id: str, host: SliceHost, transport: PipelineTransport,
                 contributing: Callable[[], bool] = lambda: True):
        self.node_id = node_id
        self.contributing = contributing  # False: "Pause contributing" — refuse work for other nodes
        self._unlinked: set[str] = set()  # peers whose link is down (their sessions were dropped)
        self._boots: dict[str, str] = {}  # peer -> the boot_id of its process we last linked to
        self.short_id = node_id[:8]
        self.host = host
        self.transport = transport
        self.acks = Acks(node_id, transport)
        self.samplers: dict[str, Sampler] = {}  # sid -> sampler (last segment only; executor thread)
        # (sid, the coordinator that ended it) -> expiry of its tombstone, set by CANCEL and
        # SESSION_END alike (a sid is never reused: each attempt has its own). Either travels on the
        # coordinator's link and can overtake a WORK still coming from the previous segment (or from
        # the coordinator's own slice, still computing when a later hop failed and the attempt was
        # ended): that WORK must not recreate the session, which would then hold its KV until the
        # TTL. Keyed by who ended it: another peer's SESSION_END for a sid it learnt stops nothing.
        self.ended: dict[tuple[str, str], float] = {}
        self.control_budget = ControlBudget()  # CANCEL / SESSION_END that cost more than a free
        transport.on_local(FrameType.WORK, self.on_work)
        transport.on_local(FrameType.CANCEL, self.on_cancel)
        transport.on_local(FrameType.SESSION_END, self.on_session_end)

    def register(self) -> None:
        """Start serving these frames from peers; watch their links (a coordinator's sessions in
        use go with its link)."""
        for ftype in (FrameType.WORK, FrameType.CANCEL, FrameType.SESSION_END):
            self.transport.register_remote(ftype)
        peers = self.transport.peers
        if peers is not None and hasattr(peers, "subscribe"):
            peers.subscribe(self._on_peer_event)

    def _on_peer_event(self, kind: str, snap: Any) -> None:
        if kind != "removed" and getattr(snap, "state", "connected") == "connected":
            self._unlinked.discard(snap.node_id)
            # a new process (HELLO boot_id) behind the peer's id: told when its link enters the
            # table, before any of its frames are delivered, so what is here now is the old one's
            boot = getattr(snap, "boot_id", None)
            if boot:
                before = self._boots.get(snap.node_id)
                self._boots[snap.node_id] = boot
                if before is not None and before != boot:
                    self.on_coordinator_restarted(snap.node_id)
            return
        if kind == "removed":
            self._boots.pop(snap.node_id, None)
            self.control_budget.forget(snap.node_id)
        if snap.node_id not in self._unlinked:  # once per loss of the link (snapshots change often)
            self._unlinked.add(snap.node_id)
            self.on_coordinator_gone(snap.node_id)
        if kind == "removed":  # forgotten by the table: kept no longer (one id per peer met, for weeks)
            self._unlinked.discard(snap.node_id)

    def on_coordinator_gone(self, node_id: str) -> None:
        """A coordinator's link is gone: it fails its attempts over (new sessions, maybe elsewhere),
        so the sessions it had open here are dropped now rather than at the TTL (300 s of KV held
        for nobody: a swarm test, 2026-12-06)."""
        self.host.free_sessions_of(node_id)

    def on_coordinator_restarted(self, node_id: str) -> None:
        """A coordinator came back as a new process (crash, kill -9, update): its kept sessions
        can never be resumed (its prefix cache died with the old one), so they are freed now, not
        after KEPT_SESSION_TTL_S of KV held for nobody and counted against this node's budget. A
        link regained by the same process (same boot_id) keeps them: its next turn resumes them."""
        self.host.free_sessions_of(node_id, restarted=True)

    # --- WORK ---------------------------------------------------------------------------------

    def on_work(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """Synchronous entry (loop thread, arrival order)."""
        received = time.monotonic()
        unsupported: SamplingUnsupported | None = None
        try:
            try:
                work = Work.from_header(header)
            except SamplingUnsupported as exc:  # a newer coordinator's field: the step is read, to refuse it
                unsupported, work = exc, Work.from_header({**header, "sampling": None})
        except ProtocolError as exc:
            log.warning("DIAG: malformed WORK dropped %s", kv(sender=sender[:8], error=exc.message))
            return
        hop = work.target
        # a step comes from the coordinator (hop 0) or the segment before: another peer naming
        # them could end a session, or have its output sent to a node that never asked for it
        came_from = work.coordinator if work.hop == 0 else work.route[work.hop - 1].node_id
        if sender != came_from:
            log.warning("DIAG: WORK from a node that is not the step's sender dropped %s",
                        kv(sender=sender[:8], expected=came_from[:8], sid=work.sid, hop=work.hop))
            return
        refusal = None
        hosted = None
        if unsupported is not None:  # not a fault: the coordinator tries a chain that can sample it
            refusal = (f"node {self.short_id} {unsupported.message}", SamplingUnsupported.code)
        elif hop.node_id != self.node_id:
            refusal = (f"WORK for node {hop.node_id[:8]} reached {self.short_id}", "misrouted")
        elif work.coordinator != self.node_id and not self.contributing() and (work.index_pos == 0 or work.resume):
            refusal = (f"node {self.short_id} has paused contributing to the swarm", "not_contributing")
        else:
            hosted = self.host.containing(work.model, hop.start, hop.end, work.sid, work.resume)
            if hosted is None:
                refusal = (f"node {self.short_id} does not serve layers {hop.start}-{hop.end - 1} of model "
                           f"{work.model[:12]}", "segment_not_served")
        if refusal is not None:
            self.acks.send(PendingAck(work, received))
            self._fail(work, *refusal)
            return
        # a session takes steps only for its coordinator, from the node whose step opened it: a
        # member naming itself the hop before could otherwise step a session it learnt the id of
        sess = hosted.model.sessions.peek(work.sid) if hosted.model is not None else None
        if sess is not None and ((sess.coordinator is not None and sess.coordinator != work.coordinator)
                                 or (sess.upstream is not None and sess.upstream != sender)):
            log.warning("DIAG: WORK into a session another node opened dropped %s",
                        kv(sender=sender[:8], sid=work.sid, hop=work.hop))
            return
        debug = log.isEnabledFor(MESSAGE)
        if self._is_ended(work.sid, work.coordinator):
            self.acks.send(PendingAck(work, received))
            if debug:
                log.log(MESSAGE, "DIAG: WORK for an ended session dropped %s", kv(sid=work.sid, seq=work.seq))
            return
        if debug:  # seed 000 marker (its guide greps `DIAG:.*LayerForward` for the forward path)
            log.log(MESSAGE, "DIAG: dispatcher received LayerForward, spawning handler %s",
                      kv(sid=work.sid, seq=work.seq, layer_range=f"{hop.start}-{hop.end - 1}", activation_bytes=len(payload)))
        q = hosted.step_queue
        with q.lock:
            room = q.room_for(sender, len(payload))
        if not room:  # a sender far ahead of the slice (or flooding it): refused, not held in memory
            self.acks.send(PendingAck(work, received))
            self._fail(work, f"node {self.short_id} has {const.SLICE_QUEUE_SENDER_MAX_BYTES >> 20} MB of steps from "
                             f"{sender[:8]} queued for layers {hop.start}-{hop.end - 1}; try again later",
                       Overloaded.code)
            return
        loop = asyncio.get_running_loop()
        ack = PendingAck(work, received)
        if work.coordinator != self.node_id:
            # Held until the step's output (or ACK_HOLD_S, if sooner): framing it now would hold the
            # GIL while the slice's thread starts the step, and a timer mid-compute would wake this
            # loop and the coordinator's while the slice's threads run.
            ack.timer = loop.call_later(const.ACK_HOLD_S, self.acks.send, ack)
        self._enqueue(loop, hosted, StepJob(work, payload, received, sender, ack))

    # --- the slice's executor: batched steps ---------------------------------------------------

    def _enqueue(self, loop: asyncio.AbstractEventLoop, hosted: HostedSlice, job: StepJob) -> None:
        """Queue a step for the slice (loop thread); one drain task on its executor at a time."""
        q = hosted.step_queue
        with q.lock:
            q.add(job)
            submit, q.scheduled = not q.scheduled, True
        if submit:
            hosted.executor.submit(self._drain, loop, hosted)

    def _drain(self, loop: asyncio.AbstractEventLoop, hosted: HostedSlice) -> None:
        """Executor thread: run one batch of what is queued, then go to the back of the executor's
        queue if more is waiting: frees, keeps and sweeps submitted meanwhile run in between, so
        a busy slice never starves them. Steps of one session stay in arrival order (a queued
        step of an ended session is dropped by its tombstone)."""
        q = hosted.step_queue
        if hosted.model is None or hosted.state == "unloaded":
            self._refuse_queued(loop, hosted)
            return
        with q.lock:
            jobs = take_batch(q.items, max_rows=self._max_rows(hosted))
            q.taken(jobs)
            if not jobs:
                q.scheduled = False
                return
        try:
            self._run(loop, hosted, jobs)
        except Exception as exc:  # a bug here must reach every coordinator, not stop the draining
            log.error("slice batch failed", exc_info=exc)
            for job in jobs:
                if not job.handed_back:
                    self._hand_back(loop, hosted, job, exc)
        with q.lock:
            if not q.items:
                q.scheduled = False
                return
        try:
            hosted.executor.submit(self._drain, loop, hosted)
        except RuntimeError:  # the slice was unloaded: its executor is shut down
            self._refuse_queued(loop, hosted)

    def _refuse_queued(self, loop: asyncio.AbstractEventLoop, hosted: HostedSlice) -> None:
        """The slice was unloaded with steps still queued: each fails at once (its coordinator
        re-plans now, not at its RESULT deadline); nothing stays in the queue."""
        q = hosted.step_queue
        with q.lock:
            jobs = list(q.items)
            q.items.clear()
            q.held.clear()
            q.scheduled = False
        for job in jobs:
            self._hand_back(loop, hosted, job, NodeError(
                f"node {self.short_id} stopped serving layers {hosted.start}-{hosted.end - 1}", code="segment_not_served"))

    @staticmethod
    def _max_rows(hosted: HostedSlice) -> int:
        """Rows per batch. int8 on fbgemm quantizes a matrix's input over all its rows and takes the
        residual pass (decode's precision) only up to SLICE_RESIDUAL_MAX_ROWS: its batches stay within
        that (a longer step runs alone, as unbatched), so a step's rows are computed as they would
        be alone. qgemm computes every row alone, at its kind's precision (prompt or generated,
        said by the WORK), in a batch of any size."""
        model = hosted.model
        if getattr(model, "fmt", None) != "int8" or getattr(model, "kernel", None) == "qgemm":
            return const.BATCH_MAX_ROWS
        return const.SLICE_RESIDUAL_MAX_ROWS

    def _run(self, loop: asyncio.AbstractEventLoop, hosted: HostedSlice, jobs: list[StepJob]) -> None:
        """Executor thread: prepare each step (a failure is that step's alone), run the ready ones
        as one forward, then sample or encode each and hand its outcome straight back to the loop
        (one call_soon_threadsafe per step: no Future/Task round trip)."""
        ready: list[tuple[StepJob, PreparedStep]] = []
        for job in jobs:
            try:
                prep = self._prepare(hosted, job)
            except Exception as exc:  # reported on the loop (a bug in the forward path must reach the coordinator)
                self._hand_back(loop, hosted, job, exc)
                continue
            if prep is None:
                self._hand_back(loop, hosted, job, None)  # ended while queued: not computed
            else:
                ready.append((job, prep))
        if not ready:
            return
        computing = time.monotonic()
        try:
            outs = hosted.model.forward_many([(p.sess, p.inputs, job.work.index_pos, p.last_only, job.work.prompt_rows)
                                              for job, p in ready])
        except Exception as exc:
            for job, _ in ready:
                self._hand_back(loop, hosted, job, exc)
            return
        computed = time.monotonic()
        for (job, prep), out in zip(ready, outs, strict=True):
            try:
                outcome: Any = self._finish(hosted, job, prep, out, computing, computed, len(ready))
            except Exception as exc:
                outcome = exc
            self._hand_back(loop, hosted, job, outcome)

    def _hand_back(self, loop: asyncio.AbstractEventLoop, hosted: HostedSlice, job: StepJob, outcome: Any) -> None:
        job.handed_back = True
        try:
            loop.call_soon_threadsafe(self._after, hosted, job.work, outcome, time.monotonic(), job.sender, job.ack)
        except RuntimeError:
            pass  # the loop is closed: the node is shutting down

    def _prepare(self, hosted: HostedSlice, job: StepJob) -> PreparedStep | None:
        """Executor thread: a step's inputs decoded and its session found (created, resumed,
        rewound) with room for its rows; None when its session ended while it was queued."""
        work, payload = job.work, job.payload
        job.started = time.monotonic()
        if self._is_ended(work.sid, work.coordinator):
            return None  # cancelled while queued behind other steps: do not compute
        model = hosted.model
        hop = work.target  # any sub-range of the slice's layers
        is_last = hop.end == model.n_layers_total
        if hop.start == 0:
            import torch  # loaded with the slice (its executor), so a lookup here

            inputs = torch.tensor(decode_tokens(payload), dtype=torch.long)
        else:
            if work.act is None:
                raise ProtocolError("WORK to a middle segment carries no activations")
            inputs = decode_activations(work.act, payload)
        if inputs.shape[0] != work.n_tokens:
            raise ProtocolError(f"WORK says n={work.n_tokens} but carries {inputs.shape[0]} rows")
        inputs = model.check_input(inputs, hop.start == 0)  # a bad one fails this step, not its batch
        sess = model.session(work.sid)
        if sess is None and work.resume is None and work.index_pos != 0:
            raise KvPositionMismatch(work.index_pos, 0, session=work.sid)
        if sess is None:  # a new session, if the node's KV budget has room for it (KvBudgetFull if not)
            sess = self.host.budget.admit(hosted, model, work, self.short_id, lambda: self._open(model, work))
            sess.upstream = job.sender
        elif (sess.layer_start, sess.layer_end) != (hop.start, hop.end):
            raise ProtocolError(f"session {work.sid} runs layers {sess.layer_start}-{sess.layer_end - 1}, "
                                f"this WORK asks for {hop.start}-{hop.end - 1}")
        elif work.rewind and sess.kv_len > work.index_pos:
            sess.truncate(work.index_pos)  # the rejected draft tokens of the previous step
        if work.index_pos != sess.kv_len:
            raise KvPositionMismatch(work.index_pos, sess.kv_len, session=work.sid)
        sess.reserve(work.index_pos + work.n_tokens)  # past the context: this step's error, not its batch's
        if log.isEnabledFor(MESSAGE):  # seed 000 marker (`DIAG:.*LayerForward`)
            log.log(MESSAGE, "DIAG: processing LayerForward locally %s",
                      kv(sid=work.sid, seq=work.seq, index_pos=work.index_pos, seq_len=work.n_tokens, kv_offset=sess.kv_len))
        verify = is_last and bool(work.draft)
        job.prepared = time.monotonic()
        return PreparedStep(sess, inputs, is_last, verify, last_only=is_last and not verify)

    @staticmethod
    def _open(model: Any, work: Work):
        """Executor thread: `work`'s new session: fresh, or (prefix reuse) a kept one cut to index_pos."""
        hop = work.target
        if work.resume is None:
            return model.new_session(work.sid, hop.start, hop.end, coordinator=work.coordinator)
        sess = model.resume_session(work.resume, work.sid, work.index_pos, work.coordinator, hop.start, hop.end,
                                    copy=work.resume_copy, room=work.n_tokens)
        log.debug("DIAG: KV session %s a kept one %s", "copied from" if work.resume_copy else "resumed from", kv(
            sid=work.sid, kept=work.resume, cached_tokens=work.index_pos, layers=f"{hop.start}-{hop.end - 1}"))
        return sess

    def _finish(self, hosted: HostedSlice, job: StepJob, prep: PreparedStep, out: torch.Tensor, computing: float,
                computed: float, batch: int):
        """Executor thread: sample (last segment) or encode the step's output; its telemetry."""
        work = job.work
        hop = work.target
        tele = HopTelemetry(self.node_id, hop.start, hop.end, kv_len=prep.sess.kv_len, bytes_in=len(job.payload),
                            wait_us=int((job.started - job.received) * 1e6))
        if batch > 1:
            tele.extra["batch"] = batch  # the forward ran this many sessions' steps at once
        codec = job.prepared - job.started
        sampling = time.monotonic()  # (after the batchmates finished before this step)
        token = scores = meta = data = None
        verified: tuple[int, ...] = ()
        if prep.is_last:
            if work.sample:
                sampler = self.samplers.get(work.sid)
                if sampler is None:
                    if work.sampling is None:
                        raise ProtocolError("first sampling step of a session carries no sampling parameters")
                    from node.inference.pipeline.sampler import Sampler  # torch: loaded with the slice

                    constrained = work.sampling.constrained
                    sampler = self.samplers[work.sid] = Sampler(
                        work.sampling, work.history, vocab=hosted.vocabulary() if constrained else None)
                if prep.verify:
                    verified = _verify(sampler, out, work.draft)
                    token = verified[0]
                else:
                    token = sampler.sample(out[-1])
                    scores = sampler.scores(out[-1], token)  # None unless the request asked for logprobs
            tele.eval_us = int((computed - computing) * 1e6) + int((time.monotonic() - sampling) * 1e6)
        else:
            encoding = time.monotonic()
            meta, data = encode_activations(out, work.activation_bits)
            tele.bytes_out = len(data)
            tele.eval_us = int((computed - computing) * 1e6)
            codec += time.monotonic() - encoding
        tele.codec_us = int(codec * 1e6)
        return tele, (token, verified), scores, meta, data

    def _after(self, hosted: HostedSlice, work: Work, outcome: Any, finished: float, sender: str,
               ack: PendingAck | None) -> None:
        """Loop thread: account the step and send its output on (WORK to the next hop, or RESULT)."""
        if isinstance(outcome, Exception):
            self.acks.send(ack)  # before the error RESULT on the same link, never after it
        if isinstance(outcome, NodeError):
            self._fail(work, outcome.message, outcome.code or "error")
            return
        if isinstance(outcome, Exception):
            log.error("slice forward failed sid=%s", work.sid, exc_info=outcome)
            self._fail(work, f"{type(outcome).__name__}: {outcome}", "internal_error")
            return
        if outcome is None or self._is_ended(work.sid, work.coordinator):
            self.acks.take(ack)  # nobody waits for it any more (dropped, with its timer)
            self._drop_ended(hosted, work.sid)
            return
        tele, (token, verified), scores, meta, data = outcome
        if (work.index_pos == 0 or work.resume is not None) and self.host.budget.committed() > self.host.kv_budget_bytes:
            # kept sessions make room for the one admitted (its reserve) now, not at the next periodic
            # sweep (a member opening 300 sessions in 3.5 s once held 28x a 1 MB budget for 8 s);
            # sessions that grow while decoding wait for that sweep, not one at every step
            self.host.request_sweep()
        batch = tele.extra.get("batch", 1)
        if batch == 1:  # a batched forward's time is not one step's: it would skew ms/layer
            self.host.note_eval(hosted, tele.eval_us, work.n_tokens, tele.end - tele.start)
        if work.coordinator != self.node_id:
            served = hosted.served
            if work.index_pos == 0 or work.resume is not None:
                served.sessions += 1
            served.coordinators[work.coordinator[:8]] = time.time()
            served.steps += 1
            served.tokens += work.n_tokens
            served.eval_ms += tele.eval_us / 1000 / batch  # this step's share of its batch
            served.bytes_in += tele.bytes_in
            served.bytes_out += tele.bytes_out
        try:
            if meta is not None:
                nxt = work.hop + 1
                # send_us: the executor's hand-back to this loop (building and writing the frame
                # cannot be in its own header: the coordinator sees them as wire time)
                tele.send_us = int((time.monotonic() - finished) * 1e6)
                nxt_node = work.route[nxt].node_id
                self.transport.send(nxt_node, FrameType.WORK, work.forward_header(nxt, meta, tele.as_wire()), data)
                # after the hidden states (the next hop starts sooner); `done` only when they are
                # on their way at once, so the next hop's ACK budget need not cover a transfer
                small = len(data) <= const.ACK_DONE_MAX_BYTES and self.transport.unsent(nxt_node) <= const.ACK_DONE_MAX_BYTES
                self.acks.send(ack, done=small)
                if log.isEnabledFor(MESSAGE):
                    log.log(MESSAGE, "DIAG: sent tensor forward to the next hop %s",
                              kv(sid=work.sid, seq=work.seq, to=work.route[nxt].node_id[:8], activation_bytes=len(data)))
            else:
                tele.send_us = int((time.monotonic() - finished) * 1e6)
                result = Result(work.sid, work.seq, token=token, telemetry=(*work.telemetry, tele.as_wire()),
                                scores=scores, tokens=verified)
                ack_header = self.acks.take(ack, done=True)  # the ACK, then the RESULT, in one write
                frames = [] if ack_header is None else [(FrameType.ACK, ack_header, b"")]
                self.transport.send_many(work.coordinator, [*frames, (FrameType.RESULT, result.to_header(), b"")])
        except PeerUnreachable as exc:
            self.acks.send(ack)
            nxt = work.route[work.hop + 1].node_id if meta is not None else None
            self._fail(work, f"next hop unreachable: {exc.message}", "next_hop_unreachable", failed_node=nxt)

    def _fail(self, work: Work, message: str, code: str, *, failed_node: str | None = None) -> None:
        # a refusal for load (the KV budget, a full queue) is back-pressure the refusal's own DIAG
        # line explains, not a fault: one INFO line, not a second WARNING for each
        log.log(logging.INFO if code == Overloaded.code else logging.WARNING, "DIAG: segment failed %s",
                kv(sid=work.sid, seq=work.seq, hop=work.hop, code=code, error=message))
        result = Result(work.sid, work.seq, telemetry=work.telemetry, error=message, error_code=code,
                        failed_node=failed_node or self.node_id)
        try:
            self.transport.send(work.coordinator, FrameType.RESULT, result.to_header())
        except PeerUnreachable:
            log.info("DIAG: failure report not delivered, coordinator unreachable %s", kv(sid=work.sid))


def _verify(sampler: Sampler, logits: torch.Tensor, draft: tuple[int, ...]) -> tuple[int, ...]:
    """A speculative step's tokens: row i of `logits` [len(draft) + 1, V] follows the draft's
    first i tokens; sample rows in order while the model agrees with the draft. The last token is
    the model's own (where it parted from the draft, or the one after a wholly accepted draft), so
    the sampler's history holds exactly the tokens the coordinator will keep."""
    p = sampler.params
    if not p.greedy or sampler.constraint is not None or p.logprobs is not None:
        raise ProtocolError("a speculative step for a session that samples, is constrained or asks for logprobs")
    if logits.shape[0] != len(draft) + 1:
        raise ProtocolError(f"a draft of {len(draft)} tokens needs {len(draft) + 1} rows, got {logits.shape[0]}")
    produced = []
    for i in range(len(draft) + 1):
        produced.append(sampler.sample(logits[i]))
        if i == len(draft) or produced[i] != draft[i]:
            break
    return tuple(produced)
