"""The coordinator: one request through a chain of segments, token by token, with failover.

For each step (a prefill chunk or one decode token) the coordinator sends WORK to segment 0;
segments forward hidden states among themselves and ACK to the coordinator (within ACK_HOLD_S of
receipt); the last segment samples and sends RESULT. A step fails when a segment reports an error,
when the link to a segment in the chain drops, or when an ACK (or the RESULT) misses its deadline,
which is derived from each peer's RFC 6298 RTO plus a compute allowance. On failure the coordinator
re-plans without the failed node (its standby chain or another cut of the ranges), re-prefills
the prompt plus every token already generated on the new route, and carries on: the client's
stream neither repeats nor skips a token. With no route left the request waits up to ROUTE_REGAIN_S
for a holder whose link just dropped to link again (run.py `PipelineRun.open`), then fails with
InsufficientCapacity (503).

This module is the node-facing object and the frame router: it opens and ends attempts (a KV
session per segment), sends their steps and hands ACKs, RESULTs and link drops to the step they
belong to. Its collaborators: `LayerHolders` (holders.py: who holds which layers, the chain),
`StepDeadlines` (deadlines.py: the step's one future and its timers), `PeerPerformance` (perf.py:
what RESULT telemetry measured) and, per request, `PipelineRun` (run.py: the token loop, failover).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from node import const
from node.errors import PeerUnreachable, ProtocolError, SegmentFailed
from node.inference.handoff import GenerationJob
from node.inference.pipeline.deadlines import Attempt, Step, StepDeadlines
from node.inference.pipeline.holders import LayerHolders
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.perf import PeerPerf, PeerPerformance
from node.inference.pipeline.prefix import ChainPrefixCache, KeptChain
from node.inference.pipeline.remote_stream import RemoteStream
from node.inference.pipeline.remote_wire import Generate, GenerateCancel, Tokens, sid_of
from node.inference.pipeline.run import PipelineRun
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import Ack, Hop, Result, SessionControl, Work, encode_tokens
from node.logs import MESSAGE, kv
from node.models.catalog import ModelEntry
from node.net import FrameType
from node.trace import RequestTrace

log = logging.getLogger(__name__)



def prompt_rows_of(prompt_len: int, index_pos: int, n_tokens: int) -> int:
    """How many of a step's first n_tokens rows (at index_pos, before any draft) are prompt tokens:
    a prefill chunk's all, a resumed prompt's tail all, a re-prefill after a failover the prompt's
    part (the rest: tokens generated before it), a decode or verify step none."""
    return max(0, min(n_tokens, prompt_len - index_pos))

class PipelineCoordinator:
    """Runs distributed generations for this node's API."""

    def __init__(self, node_id: str, transport: PipelineTransport, peers: Any | None, host: SliceHost,
                 activation_bits: int = 16, speculative_max_draft: int = 0, kv_cache_seqs: int = 0,
                 pauses: Any | None = None, region: str | None = None):
        self.node_id = node_id
        self.prefix = ChainPrefixCache(kv_cache_seqs)  # finished sessions kept on chains; 0 = off
        self.speculative_max_draft = speculative_max_draft  # n-gram speculation on chains; 0 = off
        self.transport = transport
        self.peers = peers
        self.activation_bits = activation_bits
        self.attempts: dict[str, Attempt] = {}
        self.performance = PeerPerformance(node_id)
        self.holders = LayerHolders(node_id, host, peers, transport, self.performance, region)
        # pauses: the loop watchdog, so this node's own pauses are not charged to peers
        self.deadlines = StepDeadlines(node_id, peers, self.performance, pauses)
        transport.on_local(FrameType.ACK, self.on_ack)
        transport.on_local(FrameType.RESULT, self.on_result)
        transport.on_local(FrameType.TOKENS, self.on_tokens)
        self.remote: dict[str, RemoteStream] = {}  # sid -> the attempt's remote generation (whole holder)
        self._unsubscribe: list[Callable[[], None]] = []

    def register(self) -> None:
        """Receive ACK and RESULT from peers; watch links of chains in use."""
        for ftype in (FrameType.ACK, FrameType.RESULT, FrameType.TOKENS):
            self.transport.register_remote(ftype)
        if self.peers is not None:
            self._unsubscribe.append(self.peers.subscribe(self._on_peer_event))
            lacks = getattr(self.peers, "lacks", None)  # (None: a stand-in peer table)
            if lacks is not None:
                self._unsubscribe.append(lacks.subscribe(self._on_unsupported))

    def close(self) -> None:
        """Stop watching peer links."""
        while self._unsubscribe:
            self._unsubscribe.pop()()

    @property
    def in_flight(self) -> int:
        """Pipelines this node is coordinating right now."""
        return len(self.attempts)

    @property
    def perf(self) -> dict[str, PeerPerf]:
        """Measured serving per peer node id (diagnostics `-- peer serving performance --`)."""
        return self.performance.peers

    @property
    def hop_overhead_ms(self) -> float | None:
        """EWMA of per-hop overhead over decode steps (diagnostics)."""
        return self.performance.hop_overhead_ms

    def swarm_models(self) -> dict[str, dict[str, Any]]:
        """Models (by sha256) whose layers are fully covered by this node and its peers."""
        return self.holders.swarm_models()

    # --- frames in ----------------------------------------------------------------------------

    def on_ack(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """An ACK from a segment: the step's next deadline."""
        try:
            ack = Ack.from_header(header)
        except ProtocolError as exc:
            log.warning("DIAG: malformed ACK dropped %s", kv(sender=sender[:8], error=exc.message))
            return
        att = self.attempts.get(ack.sid)
        step = att.steps.get(ack.seq) if att else None
        if step is None:
            log.debug("DIAG: No pending channel for ACK — timed out, duplicate, or old attempt %s", kv(sid=ack.sid, seq=ack.seq))
            return
        self.deadlines.acked(att, step, ack, sender)
        if log.isEnabledFor(MESSAGE):
            # seed 000 marker (its guide: grep 'DIAG: received response' | grep 'kind="ack"')
            log.log(MESSAGE, 'DIAG: received response kind="ack" %s', kv(sid=ack.sid, seq=ack.seq, hop=ack.hop, node=sender[:8]))

    def on_result(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """A RESULT from the last segment (or a failing one) resolves its step."""
        try:
            result = Result.from_header(header)
        except ProtocolError as exc:
            log.warning("DIAG: malformed RESULT dropped %s", kv(sender=sender[:8], error=exc.message))
            return
        att = self.attempts.get(result.sid)
        step = att.steps.get(result.seq) if att else None
        if step is None or step.result.done():
            log.debug("DIAG: No pending channel for RESULT — timed out, duplicate, or old attempt %s",
                      kv(sid=result.sid, seq=result.seq))
            return
        step.result.set_result(result)

    def on_tokens(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        """TOKENS from a whole holder: hand them to its attempt's stream (a malformed one fails it)."""
        try:
            msg = Tokens.from_frame(header, payload)
        except ProtocolError as exc:
            log.warning("DIAG: malformed TOKENS dropped %s", kv(sender=sender[:8], error=exc.message))
            stream = self.remote.get(sid_of(header) or "")
            if stream is not None and stream.holder == sender:
                stream.fail(SegmentFailed(f"malformed TOKENS: {exc.message}", node_id=sender, cause="protocol"))
            return
        stream = self.remote.get(msg.sid)
        if stream is None or stream.holder != sender:
            log.debug("DIAG: No pending stream for TOKENS — ended, cancelled, or old attempt %s",
                      kv(sid=msg.sid, node=sender[:8]))
            return
        if stream.received == 0 and (lacks := getattr(self.peers, "lacks", None)) is not None:
            lacks.note_knows(sender, FrameType.GENERATE)  # an unnamed unsupported_frame_type is not about it
        stream.feed(msg)

    def _on_unsupported(self, node_id: str, frame_type: int | None) -> None:
        """A peer refused a frame type as unknown (PeerLacks): when it is GENERATE, or unnamed (a
        peer before 2026-12-07) while a GENERATE waits on it that it has not shown it serves, every
        remote generation waiting on it fails now and it is planned on for none until it restarts
        (holders.py); a peer before remote generate (2026-12-02) was waited out for its whole silence
        budget, GENERATE_SILENCE_S, then charged as `tokens_deadline` (until 2026-12-07)."""
        waiting = [s for s in self.remote.values() if s.holder == node_id]
        if not self.peers.lacks.refuses(node_id, frame_type, FrameType.GENERATE, bool(waiting)):
            return
        for stream in waiting:
            stream.fail(SegmentFailed(f"{node_id[:8]}'s version has no remote generation (it refused GENERATE "
                                      "as an unknown frame type): update it", node_id=node_id, cause="old_version"))

    def _on_peer_event(self, kind: str, snap: Any) -> None:
        self.holders.note_peer(kind, snap)
        if kind == "removed":
            self.performance.peers.pop(snap.node_id, None)  # measured again if it comes back
            for kept in self.prefix.through(snap.node_id):
                self._end_kept(kept, skip=snap.node_id)
        if kind == "removed" or snap.state != "connected":
            for att in list(self.attempts.values()):
                if snap.node_id in att.nodes() and not att.failed.done():
                    failure = SegmentFailed(f"link to {snap.short_id} dropped ({snap.state})", node_id=snap.node_id,
                                            cause="link_drop")
                    att.fail(failure)
                    stream = self.remote.get(att.sid)
                    if stream is not None:
                        stream.fail(failure)

    # --- attempts -----------------------------------------------------------------------------

    async def begin(self, job: GenerationJob, entry: ModelEntry, trace: RequestTrace,
                    is_eog: Callable[[int], bool]) -> PipelineRun:
        """Plan the first route now (InsufficientCapacity before any response byte; waiting up to
        ROUTE_REGAIN_S for a holder whose link dropped a moment ago), run later."""
        run = PipelineRun(self, self.deadlines, self.performance, job, entry, trace, is_eog)
        run.attempt = await run.open()
        return run

    def regain(self, sha256: str, lost: dict[str, int | None],
               silent: dict[str, float] | None = None) -> tuple[set[str], list[str]]:
        """(nodes of `lost` linked again, peers worth waiting for): LayerHolders.regain."""
        return self.holders.regain(sha256, lost, silent)

    def open_attempt(self, job: GenerationJob, entry: ModelEntry, trace: RequestTrace, attempt_no: int,
                     excluded: frozenset[str]) -> Attempt:
        """Plan a chain without the excluded nodes and track its session (InsufficientCapacity if none)."""
        reuses = attempt_no == 1  # (a failed-over attempt prefills prompt + generated afresh)
        prefer = self.prefix.route_for(entry.sha256, list(job.prompt_tokens)) if reuses else None
        load = collections.Counter(node for a in self.attempts.values() if not a.failed.done() for node in a.nodes())
        plan, kinds = self.holders.assemble(entry, trace, attempt_no, excluded, prefer=prefer, load=load,
                                            needs=job.params.features())
        sid = f"{job.request_id}/{attempt_no}"
        att = Attempt(sid, entry.sha256, plan, tuple(Hop(h.node_id, h.start, h.end) for h in plan.segments), kinds,
                      asyncio.get_running_loop().create_future())
        att.links = self.holders.connection_ids(att.nodes() - {self.node_id})
        if reuses and not (len(plan.segments) == 1 and plan.segments[0].whole):  # prefix reuse
            kept, n, copy = self.prefix.take(entry.sha256, att.route, list(job.prompt_tokens), job.request_id)
            if kept is not None:
                att.resume, att.cached, att.resume_copy = kept.sid, n, copy
        self.attempts[sid] = att
        return att

    def send_step(self, att: Attempt, job: GenerationJob, tokens: list[int], index_pos: int, *, sample: bool,
                  history: tuple[int, ...], trace: RequestTrace, draft: tuple[int, ...] = (),
                  rewind: bool = False, resume: str | None = None, expect: int | None = None) -> Step:
        """WORK for `tokens` (then the drafted `draft`) at `index_pos` to segment 0; the step to wait
        for (resolved with an `unreachable` error RESULT at once when segment 0 cannot be reached).
        `rewind`: the segments forget their positions from index_pos on (a rejected draft);
        `resume`: the session starts as that kept one, cut to index_pos (prefix reuse); `expect`
        (the step opening the sessions): the positions the attempt prefills (KV admission)."""
        prompt_rows = prompt_rows_of(len(job.prompt_tokens), index_pos, len(tokens))
        tokens = [*tokens, *draft]
        seq = att.next_seq
        att.next_seq += 1
        work = Work(sid=att.sid, model=att.model_sha, seq=seq, index_pos=index_pos, n_tokens=len(tokens),
                    route=att.route, hop=0, coordinator=self.node_id, sample=sample,
                    activation_bits=self.activation_bits,
                    sampling=job.params if sample else None,  # the last segment builds its sampler once
                    history=history, draft=draft, rewind=rewind, resume=resume,
                    resume_copy=resume is not None and att.resume_copy, prompt_rows=prompt_rows, expect=expect)
        step = Step(seq, len(tokens), time.monotonic(), asyncio.get_running_loop().create_future())
        att.steps[seq] = step
        if log.isEnabledFor(MESSAGE):
            # seed 000 marker, in its index_pos/kv_offset grep (gotcha #400): the words stay
            log.log(MESSAGE, "DIAG: starting forward_through_segments %s", kv(
                request_id=trace.request_id, sid=att.sid, seq_num=seq, index_pos=index_pos, seq_len=len(tokens),
                kv_offset=att.kv_len, rewind=rewind, resume=resume))  # measured by the segments on the last step; must
            # equal index_pos, or exceed it by the rejected draft tokens when `rewind`
        try:
            self.transport.send(att.route[0].node_id, FrameType.WORK, work.to_header(), encode_tokens(tokens))
        except PeerUnreachable as exc:
            step.result.set_result(Result(att.sid, seq, error=exc.message, error_code="unreachable",
                                          failed_node=att.route[0].node_id))
        return step

    def resume_missed(self, att: Attempt, source_gone: bool = True) -> None:
        """The kept session `att` resumed was gone on a segment: count it a miss, not a hit; one
        it copied from, when a segment refused it (`source_gone`), is forgotten and freed on the
        segments still holding it."""
        gone = self.prefix.missed_on_segment(att.cached, att.resume if att.resume_copy else None, source_gone)
        if gone is not None:
            self._end_kept(gone)

    def _end_kept(self, kept: KeptChain, skip: str | None = None, reason: str = "evicted") -> None:
        """Free a kept session on its segments (evicted here, its chain lost a node, resumed)."""
        ctl = SessionControl(kept.sid, kept.model, reason).to_header()
        for hop in kept.route:
            if hop.node_id != skip:
                try:
                    self.transport.send(hop.node_id, FrameType.SESSION_END, ctl)
                except PeerUnreachable:
                    pass  # its TTL frees it there

    def start_remote(self, att: Attempt, job: GenerationJob, prompt: list[int], max_new_tokens: int) -> RemoteStream:
        """GENERATE to the attempt's one segment, a node holding the model whole; the stream its
        TOKENS arrive on (failed at once when the holder cannot be reached)."""
        holder = att.route[0].node_id
        budget = const.GENERATE_SILENCE_S + self.deadlines.ack_budget(holder)
        rto = self.peers.rto(holder) if self.peers is not None else None
        stream = RemoteStream(att.sid, holder, budget, rto.backoff if rto is not None else None,
                              pauses=self.deadlines.pauses)
        self.remote[att.sid] = stream
        gen = Generate(att.sid, att.model_sha, tuple(prompt), job.params, max_new_tokens, self.node_id,
                       n_generated=len(prompt) - len(job.prompt_tokens))
        log.debug("DIAG: remote generate sent %s", kv(request_id=job.request_id, sid=att.sid, node=holder[:8],
                                                      prompt_tokens=len(prompt), max_new=max_new_tokens))
        try:
            self.transport.send(holder, FrameType.GENERATE, gen.to_header(), gen.payload())
        except PeerUnreachable as exc:
            stream.fail(SegmentFailed(exc.message, node_id=holder, cause="unreachable"))
        return stream

    def end(self, att: Attempt, how: str, keep: tuple[int, ...] = ()) -> None:
        """Free the attempt's KV sessions on every segment (CANCEL when the client went away); a
        remote generation still running is cancelled on its holder. `keep`: the tokens whose KV
        the sessions hold (a normal end): they stay kept on the segments for a later request
        that extends them (prefix reuse), within this coordinator's kv_cache_seqs per model."""
        if self.attempts.pop(att.sid, None) is None:
            return
        stream = self.remote.pop(att.sid, None)
        if stream is not None:
            stream.close()
            lacks = getattr(self.peers, "lacks", None)
            if not stream.ended and not stream.finishing and not (lacks is not None and lacks.lacks(stream.holder, FrameType.GENERATE)):  # still running there (or stalled: it must not resume for nobody)
                try:
                    self.transport.send(stream.holder, FrameType.GENERATE_CANCEL, GenerateCancel(att.sid).to_header())
                except PeerUnreachable:
                    pass  # a holder whose coordinator's link dropped stops by itself
            return
        ftype = FrameType.CANCEL if how == "cancel" else FrameType.SESSION_END
        kept = (how == "session_end" and self.prefix.max_per_model > 0 and not att.failed.done()
                and len(keep) >= const.CHAIN_PREFIX_MIN_TOKENS)
        ctl = SessionControl(att.sid, att.model_sha, how, keep=kept).to_header()
        unreachable = None
        for hop in att.route:
            try:
                self.transport.send(hop.node_id, ftype, ctl)
            except PeerUnreachable:
                unreachable = hop.node_id  # a dead peer frees its sessions with its process; a live one by TTL
        if att.resume is not None and not att.resume_copy:
            # the kept session this attempt resumed: gone where its first WORK arrived (renamed),
            # still held where it did not (a segment after one that missed, a request ended
            # before its first step): freed there now, not at the kept TTL
            self._end_kept(KeptChain(att.resume, att.model_sha, att.route, (), 0.0), skip=unreachable, reason="resumed")
        if kept:
            chain = KeptChain(att.sid, att.model_sha, att.route, keep, time.monotonic())
            if unreachable is not None:  # a chain with a hole: nothing to resume, free the rest
                self._end_kept(chain, skip=unreachable)
            else:
                for evicted in self.prefix.put(chain):
                    self._end_kept(evicted)
        for step in att.steps.values():
            step.disarm()
            if not step.result.done():
                step.result.cancel()
