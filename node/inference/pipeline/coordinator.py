"""The coordinator: one request through a chain of segments, token by token, with failover.

For each step (a prefill chunk or one decode token) the coordinator sends WORK to segment 0;
segments forward hidden states among themselves and ACK to the coordinator (within ACK_HOLD_S of
receipt); the last segment samples and sends RESULT. A step fails when a segment reports an error,
when the link to a segment in the chain drops, or when an ACK (or the RESULT) misses its deadline,
which is derived from each peer's RFC 6298 RTO plus a compute allowance. On failure the coordinator
re-plans without the failed node (a standby of the same layers first), re-prefills the prompt plus
every token already generated on the new route, and carries on: the client's stream neither repeats
nor skips a token. With no route left the request fails with InsufficientCapacity (503).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from node import const
from node.errors import InsufficientCapacity, PeerUnreachable, ProtocolError, SegmentFailed
from node.inference.engine import GenerationJob
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.planner import Holder, Plan, plan_route
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import Ack, Hop, Result, SessionControl, Work, encode_tokens
from node.logs import kv
from node.models.catalog import ModelEntry
from node.net import FrameType
from node.trace import RequestTrace, SegmentTrace

log = logging.getLogger(__name__)

_TELE_US = ("eval_us", "wait_us", "codec_us", "send_us")  # per-segment timings in RESULT telemetry


@dataclass
class _Step:
    seq: int
    n_tokens: int
    sent_at: float
    result: asyncio.Future
    acks: dict[int, tuple[float, bool]] = field(default_factory=dict)  # hop -> (when, its output had left)
    timer: asyncio.TimerHandle | None = None  # the pending deadline of a step being waited for
    trace: RequestTrace | None = None  # set while waited for (deadline log lines)


@dataclass
class _Attempt:
    sid: str
    model_sha: str
    plan: Plan
    route: tuple[Hop, ...]
    kinds: list[str]  # transport per hop: local | direct | relayed
    failed: asyncio.Future
    steps: dict[int, _Step] = field(default_factory=dict)
    next_seq: int = 0
    kv_len: int | None = None  # KV length segment 0 reported after the last completed step

    def nodes(self) -> set[str]:
        return {h.node_id for h in self.route}


@dataclass
class PeerPerf:
    """What this coordinator measured of a peer's serving (diagnostics `peer serving performance`)."""

    samples: int = 0
    ms_per_layer: float | None = None
    ewma_step_ms: float | None = None
    region: str | None = None

    def observe(self, eval_us: int, layers: int, n_tokens: int, step_ms: float) -> None:
        self.samples += 1
        if n_tokens == 1 and layers > 0:
            per_layer = eval_us / 1000.0 / layers
            self.ms_per_layer = per_layer if self.ms_per_layer is None else 0.8 * self.ms_per_layer + 0.2 * per_layer
        self.ewma_step_ms = step_ms if self.ewma_step_ms is None else 0.8 * self.ewma_step_ms + 0.2 * step_ms


class PipelineCoordinator:
    """Runs distributed generations for this node's API."""

    def __init__(self, node_id: str, transport: PipelineTransport, peers: Any | None, host: SliceHost,
                 activation_bits: int = 16):
        self.node_id = node_id
        self.transport = transport
        self.peers = peers
        self.host = host
        self.activation_bits = activation_bits
        self.attempts: dict[str, _Attempt] = {}
        self.perf: dict[str, PeerPerf] = {}
        self.hop_overhead_ms: float | None = None  # EWMA of (step wall - compute) / hops, decode steps
        transport.on_local(FrameType.ACK, self.on_ack)
        transport.on_local(FrameType.RESULT, self.on_result)
        self._unsubscribe: Callable[[], None] | None = None

    def register(self) -> None:
        """Receive ACK and RESULT from peers; watch links of chains in use."""
        for ftype in (FrameType.ACK, FrameType.RESULT):
            self.transport.register_remote(ftype)
        if self.peers is not None:
            self._unsubscribe = self.peers.subscribe(self._on_peer_event)

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()

    @property
    def in_flight(self) -> int:
        """Pipelines this node is coordinating right now."""
        return len(self.attempts)

    # --- holders ------------------------------------------------------------------------------

    def holders(self, sha256: str) -> list[Holder]:
        """Every node that can run a range of this model now: our slices first, then peers'."""
        out = [Holder(self.node_id, s.start, s.end, "local", 0.0, s.ms_per_layer) for s in self.host.for_model(sha256)]
        if self.peers is None:
            return out
        for snap in self.peers.peers():
            if snap.state != "connected":
                continue
            perf = self.perf.get(snap.node_id)
            for m in snap.models:
                if m.get("sha256") != sha256 or "start" not in m:
                    continue
                measured = perf.ms_per_layer if perf and perf.ms_per_layer is not None else m.get("ms_per_layer")
                out.append(Holder(snap.node_id, int(m["start"]), int(m["end"]), snap.transport or "direct",
                                  snap.rtt_ms or 0.0, measured, snap.region))
        return out

    def swarm_models(self) -> dict[str, dict[str, Any]]:
        """Models (by sha256) whose layers are fully covered by this node and its peers."""
        found: dict[str, dict[str, Any]] = {}
        adverts = [(self.node_id, a) for a in self.host.adverts()]
        if self.peers is not None:
            adverts += [(s.node_id, m) for s in self.peers.peers() if s.state == "connected" for m in s.models]
        for _, m in adverts:
            sha = m.get("sha256")
            if sha and "start" in m:
                found.setdefault(sha, {"name": m.get("name"), "n_layers": int(m.get("n_layers", 0))})
        return {sha: info for sha, info in found.items()
                if self._covered(sha, info["n_layers"])}

    def _covered(self, sha: str, n_layers: int) -> bool:
        try:
            plan_route(n_layers, self.holders(sha))
        except InsufficientCapacity:
            return False
        return True

    # --- frames in ----------------------------------------------------------------------------

    def on_ack(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
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
        now = time.monotonic()
        step.acks[ack.hop] = (now, ack.done)
        if step.timer is not None:
            self._arm(att, step)  # the next deadline (a done ACK brings it forward)
        if log.isEnabledFor(logging.DEBUG):
            log.debug('DIAG: received response kind="ack" %s', kv(sid=ack.sid, seq=ack.seq, hop=ack.hop, node=sender[:8]))
        rto = self.peers.rto(sender) if self.peers is not None else None
        if rto is not None and ack.hop == 0 and sender != self.node_id and step.n_tokens == 1:
            # (one token: no prefill chunk travelling ahead of the ACK on a shared link)
            # coordinator → segment 0 → coordinator is a true round trip, less the time the ACK was held
            rto.observe(max(0.0, now - step.sent_at - ack.held_us / 1e6))

    def on_result(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        try:
            result = Result.from_header(header)
        except ProtocolError as exc:
            log.warning("DIAG: malformed RESULT dropped %s", kv(sender=sender[:8], error=exc.message))
            return
        att = self.attempts.get(result.sid)
        step = att.steps.get(result.seq) if att else None
        if step is None or step.result.done():
            log.debug("DIAG: No pending channel for LayerResult — timed out, duplicate, or hedge loser %s",
                      kv(sid=result.sid, seq=result.seq))
            return
        step.result.set_result(result)

    def _on_peer_event(self, kind: str, snap: Any) -> None:
        if kind == "removed" or snap.state != "connected":
            for att in list(self.attempts.values()):
                if snap.node_id in att.nodes() and not att.failed.done():
                    failure = SegmentFailed(f"link to {snap.short_id} dropped ({snap.state})", node_id=snap.node_id,
                                            cause="link_drop")
                    att.failed.set_result(failure)
                    for step in att.steps.values():
                        if not step.result.done():
                            step.result.set_result(failure)

    # --- one request --------------------------------------------------------------------------

    def begin(self, job: GenerationJob, entry: ModelEntry, trace: RequestTrace,
              is_eog: Callable[[int], bool]) -> PipelineRun:
        """Plan the first route now (InsufficientCapacity before any response byte), run later."""
        run = PipelineRun(self, job, entry, trace, is_eog)
        run.attempt = self._assemble(job, entry, trace, 1, frozenset())
        return run

    def _assemble(self, job: GenerationJob, entry: ModelEntry, trace: RequestTrace, attempt_no: int,
                  excluded: frozenset[str]) -> _Attempt:
        started = trace.begin_assembly()
        holders = self.holders(entry.sha256)
        try:
            plan = plan_route(entry.n_layers, holders, exclude=excluded)
        except InsufficientCapacity:
            trace.end_assembly(started)
            raise
        kinds = [self.transport.kind(h.node_id) for h in plan.segments]
        segments = [SegmentTrace(h.short_id, h.start, h.end, kind) for h, kind in zip(plan.segments, kinds, strict=True)]
        trace.end_assembly(started, segments)
        trace.route = "relayed" if "relayed" in kinds else "distributed"
        trace.regions = [h.region for h in plan.segments if h.region]
        sid = f"{job.request_id}/{attempt_no}"
        att = _Attempt(sid, entry.sha256, plan, tuple(Hop(h.node_id, h.start, h.end) for h in plan.segments), kinds,
                       asyncio.get_running_loop().create_future())
        self.attempts[sid] = att
        standbys = ",".join(s.short_id if s else "-" for s in plan.standbys)
        log.info("DIAG: pipeline assembled %s", kv(
            request_id=trace.request_id, attempt=attempt_no, segments=plan.describe(), standbys=standbys,
            est_ms_per_token=round(plan.est_ms, 2), schedule_ms=round((time.monotonic() - started) * 1000, 2)))
        return att

    async def _run(self, att: _Attempt, job: GenerationJob, generated: list[int], is_eog, trace: RequestTrace):
        """Prefill prompt + generated, then decode; yields new tokens."""
        tokens = list(job.prompt_tokens) + generated
        chunk = const.PREFILL_CHUNK_TOKENS
        last_step = None
        for start in range(0, len(tokens), chunk):
            part = tokens[start:start + chunk]
            last_step = self._send_step(att, job, part, start, sample=start + chunk >= len(tokens),
                                        history=tuple(generated), trace=trace)
        token = await self._wait(att, last_step, trace)
        while True:
            generated.append(token)
            yield token
            if is_eog(token) or len(generated) >= job.max_new_tokens or job.cancel.is_set():
                return
            index_pos = len(job.prompt_tokens) + len(generated) - 1
            step = self._send_step(att, job, [token], index_pos, sample=True, history=(), trace=trace)
            token = await self._wait(att, step, trace)

    def _send_step(self, att: _Attempt, job: GenerationJob, tokens: list[int], index_pos: int, *, sample: bool,
                   history: tuple[int, ...], trace: RequestTrace) -> _Step:
        seq = att.next_seq
        att.next_seq += 1
        work = Work(sid=att.sid, model=att.model_sha, seq=seq, index_pos=index_pos, n_tokens=len(tokens),
                    route=att.route, hop=0, coordinator=self.node_id, sample=sample,
                    activation_bits=self.activation_bits,
                    sampling=job.params if sample else None,  # the last segment builds its sampler once
                    history=history)
        step = _Step(seq, len(tokens), time.monotonic(), asyncio.get_running_loop().create_future())
        att.steps[seq] = step
        if log.isEnabledFor(logging.DEBUG):
            log.debug("DIAG: starting forward_through_segments %s", kv(
                request_id=trace.request_id, sid=att.sid, seq_num=seq, index_pos=index_pos, seq_len=len(tokens),
                kv_offset=att.kv_len))  # measured by the segments on the last step; must equal index_pos
        try:
            self.transport.send(att.route[0].node_id, FrameType.WORK, work.to_header(), encode_tokens(tokens))
        except PeerUnreachable as exc:
            step.result.set_result(Result(att.sid, seq, error=exc.message, error_code="unreachable",
                                          failed_node=att.route[0].node_id))
        return step

    def _deadline(self, att: _Attempt, step: _Step) -> tuple[float, int, str]:
        """(time, hop, what) of the earliest deadline still pending for this step."""
        basis = step.sent_at
        for i, hop in enumerate(att.route):
            got = step.acks.get(i)
            if got is None:
                if att.kinds[i] != "local":
                    return basis + self._ack_budget(hop.node_id), i, "ack"
                got = (basis, False)  # our own hop, still computing: no message to miss
            acked, done = got
            # an ACK sent with the step's output starts the next hop's clock; an earlier one (a
            # slow step, after ACK_HOLD_S) leaves the step its compute allowance first
            basis = acked if done else acked + self._compute_allowance(hop, step.n_tokens)
        last = att.route[-1].node_id
        # our own last hop: its RESULT follows its ACK within a loop pass; a margin, not a race
        return basis + (const.ACK_HOLD_S if att.kinds[-1] == "local" else self._ack_budget(last)), len(att.route) - 1, "result"

    def _ack_budget(self, node_id: str) -> float:
        rto = self.peers.rto(node_id) if self.peers is not None else None
        # a segment may hold its ACK for ACK_HOLD_S (it rides with the output of a quick step)
        return max(const.ACK_DEADLINE_MIN_S, rto.rto_s if rto is not None else const.RTO_INITIAL_S) + const.ACK_HOLD_S

    def _compute_allowance(self, hop: Hop, n_tokens: int) -> float:
        perf = self.perf.get(hop.node_id)
        per_layer = perf.ms_per_layer if perf and perf.ms_per_layer else 5.0
        return max(const.STEP_COMPUTE_MIN_S, const.STEP_COMPUTE_FACTOR * per_layer * (hop.end - hop.start) * n_tokens / 1000)

    async def _wait(self, att: _Attempt, step: _Step, trace: RequestTrace) -> int:
        """The step's sampled token. Its RESULT, a dropped link (set by the peer observer) or the
        deadline timer (re-armed by each ACK, never a wake-up of this task) resolves step.result."""
        if att.failed.done():
            raise att.failed.result()
        step.trace = trace
        self._arm(att, step)
        try:
            outcome = await step.result
        finally:
            self._disarm(step)
        if isinstance(outcome, SegmentFailed):
            raise outcome
        result: Result = outcome
        if result.error is not None:
            raise SegmentFailed(result.error, node_id=result.failed_node or att.route[0].node_id,
                                cause=result.error_code or "error")
        self._account(att, step, result, trace)
        if result.token is None:
            raise SegmentFailed("RESULT of a sampling step carries no token", node_id=att.route[-1].node_id,
                                cause="protocol")
        return result.token

    def _arm(self, att: _Attempt, step: _Step) -> None:
        """(Re)schedule the step's earliest pending deadline."""
        deadline, hop, what = self._deadline(att, step)
        self._disarm(step)
        step.timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), self._expire,
                                                           att, step, hop, what)

    @staticmethod
    def _disarm(step: _Step) -> None:
        if step.timer is not None:
            step.timer.cancel()
            step.timer = None

    def _expire(self, att: _Attempt, step: _Step, hop: int, what: str) -> None:
        """Loop timer: a deadline passed with nothing from the hop it waited for."""
        step.timer = None
        if step.result.done():
            return
        trace = step.trace
        node = att.route[hop].node_id
        rto = self.peers.rto(node) if self.peers is not None else None
        if rto is not None:
            rto.backoff()
        if what == "ack":
            log.warning("DIAG: tensor forward not acknowledged within the ACK deadline %s",
                        kv(request_id=trace.request_id, sid=att.sid, seq=step.seq, hop=hop, node=node[:8]))
        else:
            log.warning("DIAG: segment TIMED OUT — no result received %s",
                        kv(request_id=trace.request_id, sid=att.sid, seq=step.seq, node=node[:8]))
        step.result.set_result(SegmentFailed(f"no {what.upper()} from {node[:8]} within the deadline", node_id=node,
                                             cause=f"{what}_deadline"))

    def _account(self, att: _Attempt, step: _Step, result: Result, trace: RequestTrace) -> None:
        wall_ms = (time.monotonic() - step.sent_at) * 1000
        compute_ms = 0.0
        base_ms: float | None = None  # one thread hand-off and hand-back: a single process pays them too
        by_start = {seg.layer_start: seg for seg in trace.segments}
        if result.telemetry and "kv_len" in result.telemetry[0]:
            att.kv_len = int(result.telemetry[0]["kv_len"])
        for tele in result.telemetry:
            seg = by_start.get(int(tele.get("start", -1)))
            eval_us, wait_us, codec_us, send_us = (int(tele.get(k, 0)) for k in _TELE_US)
            compute_ms += eval_us / 1000
            node = str(tele.get("node", ""))
            if base_ms is None or node == self.node_id:
                base_ms = (wait_us + send_us) / 1000
            if seg is not None:
                seg.elapsed_ms += (eval_us + wait_us + codec_us + send_us) / 1000
                seg.activation_bytes += int(tele.get("bytes_out", 0))
                for key in _TELE_US:
                    seg.telemetry[key] = seg.telemetry.get(key, 0) + int(tele.get(key, 0))
            if node and node != self.node_id:
                self.perf.setdefault(node, PeerPerf()).observe(eval_us, int(tele.get("end", 0)) - int(tele.get("start", 0)),
                                                               step.n_tokens, wall_ms)
        if step.n_tokens == 1 and att.route:
            # network hops: between consecutive segments (always two nodes), plus into the first
            # and back from the last when those are not this node
            hops = len(att.route) - 1 + (att.kinds[0] != "local") + (att.kinds[-1] != "local")
            if hops:
                # everything but compute (codec, queueing, thread hand-offs, framing, TLS, the wire)
                # is hop cost, except the one hand-off/hand-back a single segment also pays
                overhead = max(0.0, wall_ms - compute_ms - (base_ms or 0.0)) / hops
                self.hop_overhead_ms = overhead if self.hop_overhead_ms is None else 0.9 * self.hop_overhead_ms + 0.1 * overhead
        att.steps.pop(step.seq, None)

    def _end(self, att: _Attempt, how: str) -> None:
        """Free the attempt's KV sessions on every segment (CANCEL when the client went away)."""
        if self.attempts.pop(att.sid, None) is None:
            return
        ftype = FrameType.CANCEL if how == "cancel" else FrameType.SESSION_END
        ctl = SessionControl(att.sid, att.model_sha, how).to_header()
        for hop in att.route:
            try:
                self.transport.send(hop.node_id, ftype, ctl)
            except PeerUnreachable:
                pass  # a dead peer frees its sessions with its process; a live one by TTL
        for step in att.steps.values():
            self._disarm(step)
            if not step.result.done():
                step.result.cancel()


class PipelineRun:
    """One request's distributed generation: yields tokens, re-plans on failure."""

    def __init__(self, coordinator: PipelineCoordinator, job: GenerationJob, entry: ModelEntry, trace: RequestTrace,
                 is_eog: Callable[[int], bool]):
        self.c = coordinator
        self.job, self.entry, self.trace, self.is_eog = job, entry, trace, is_eog
        self.generated: list[int] = []
        self.excluded: set[str] = set()
        self.attempt_no = 1
        self.attempt: _Attempt | None = None

    async def tokens(self) -> AsyncIterator[list[int]]:
        """Sampled tokens, one per list, until EOG, max tokens or cancel."""
        c, trace = self.c, self.trace
        while True:
            att = self.attempt
            if att is None:
                att = self.attempt = c._assemble(self.job, self.entry, trace, self.attempt_no, frozenset(self.excluded))
            try:
                async for token in c._run(att, self.job, self.generated, self.is_eog, trace):
                    yield [token]
                c._end(att, "session_end")
                self._log_segments()
                return
            except SegmentFailed as failure:
                c._end(att, "session_end")
                self._failed_over(att, failure)
            except GeneratorExit:  # the consumer stopped reading (EOG, stop sequence): a normal end
                c._end(att, "session_end")
                raise
            except BaseException:  # cancelled (client gone) or failed: every segment stops and frees
                c._end(att, "cancel")
                raise

    def _failed_over(self, att: _Attempt, failure: SegmentFailed) -> None:
        trace = self.trace
        self.excluded.add(failure.node_id)
        chain = [h.node_id for h in att.plan.segments]
        standby = att.plan.standbys[chain.index(failure.node_id)] if failure.node_id in chain else None
        log.warning("DIAG: pipeline attempt failed %s", kv(
            request_id=trace.request_id, attempt=self.attempt_no, node=failure.node_id[:8], cause=failure.cause,
            error=failure.message, tokens_so_far=len(self.generated)))
        if trace.first_attempt_cause is None:
            trace.first_attempt_cause = f"{failure.cause}: {failure.message}"
        if standby is not None:
            log.info("DIAG: failing over to standby %s", kv(request_id=trace.request_id, failed=failure.node_id[:8],
                                                            standby=standby.short_id))
        else:
            log.warning("DIAG: NO standby available for failed segment %s",
                        kv(request_id=trace.request_id, failed=failure.node_id[:8]))
        if self.attempt_no >= const.MAX_ASSEMBLIES:
            raise InsufficientCapacity(f"the pipeline failed {self.attempt_no} times; last: {failure.message}")
        self.attempt_no += 1
        self.attempt = None

    def _log_segments(self) -> None:
        trace = self.trace
        for i, seg in enumerate(trace.segments):
            log.debug("DIAG: %s segment complete %s", "local" if seg.transport == "local" else "remote", kv(
                request_id=trace.request_id, seg=i, node=seg.node_short_id, layers=f"{seg.layer_start}-{seg.layer_end - 1}",
                segment_ms=round(seg.elapsed_ms, 1), activation_bytes=seg.activation_bytes, transport=seg.transport))
        log.debug("DIAG: forward_through_segments completed %s", kv(
            request_id=trace.request_id, tokens=len(self.generated), assemblies=trace.assemblies))

    def close(self) -> None:
        """Free whatever the current attempt holds (idempotent)."""
        if self.attempt is not None:
            self.c._end(self.attempt, "cancel")
