"""One request's distributed generation: prefill, decode token by token, fail over, end cleanly.

`PipelineRun` is what `PipelineCoordinator.begin` hands to generate.py. Each attempt prefills the
prompt plus every token already generated (`prefill_steps`: steps of at most PREFILL_CHUNK_TOKENS,
at least one per segment when long enough, sent back to back so segments overlap them), then
decodes one token per step — or, for a greedy request, the last token followed by an n-gram draft
(node.inference.speculate), which the last segment verifies in the same step; the next step
rewinds the rows of rejected draft tokens on every segment. A step that fails (SegmentFailed: an
error RESULT, a dropped link, a missed deadline) ends the attempt's sessions, excludes the failed
node and re-plans: the new chain covers the gap with whatever holders or sub-ranges are cheapest
now (the plan's standby chain for the failed segment, or another cut of the survivors' ranges). It re-prefills and its last segment samples the next token, so the client
sees no repeat and no gap. With no chain left while a holder's link dropped a moment ago, `open` waits
up to ROUTE_REGAIN_S for it to link again. After MAX_ASSEMBLIES failed attempts the request fails
with InsufficientCapacity; not counted are one kept-session miss and the failures excused by this
node's own pause (each node once per pause, MAX_ASSEMBLIES at most), so a request makes at most
2 x MAX_ASSEMBLIES + 1 attempts (that bookkeeping: failover.py, `Failover`, PipelineRun's base).

An attempt whose chain is one node holding the model whole (`Holder.whole`) runs as a remote
generate instead of WORK steps: GENERATE with prompt + generated, then the holder's TOKENS
batches (remote_stream.py), which fail over the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from node import const
from node.errors import (
    ContextLengthExceeded,
    InsufficientCapacity,
    InvalidRequest,
    Overloaded,
    SamplingUnsupported,
    SamplingUnsupportedBySwarm,
    SegmentFailed,
    Unsupported,
)
from node.inference.handoff import GenerationJob, TokenBatch
from node.inference.pipeline.deadlines import Attempt, Step, StepDeadlines
from node.inference.pipeline.failover import Failover
from node.inference.pipeline.perf import PeerPerformance, add_segment_telemetry
from node.inference.pipeline.remote_stream import RemoteStream
from node.inference.pipeline.remote_wire import Tokens
from node.inference.pipeline.wire import Result
from node.inference.speculate import NgramDrafter, SpeculationStats, accept_count, speculation_off_reason
from node.logs import kv
from node.models.catalog import ModelEntry
from node.trace import RequestTrace


class AttemptChannel(Protocol):
    """What a run needs of the coordinator (PipelineCoordinator implements it): open an attempt
    on a chain, send it steps, end it. A Protocol here, so run.py does not import the module that
    creates runs."""

    def open_attempt(self, job: GenerationJob, entry: ModelEntry, trace: RequestTrace, attempt_no: int,
                     excluded: frozenset[str]) -> Attempt: ...

    def send_step(self, att: Attempt, job: GenerationJob, tokens: list[int], index_pos: int, *, sample: bool,
                  history: tuple[int, ...], trace: RequestTrace, draft: tuple[int, ...] = (),
                  rewind: bool = False, resume: str | None = None, expect: int | None = None) -> Step: ...

    @property
    def speculative_max_draft(self) -> int: ...

    def start_remote(self, att: Attempt, job: GenerationJob, prompt: list[int],
                     max_new_tokens: int) -> RemoteStream: ...

    def end(self, att: Attempt, how: str, keep: tuple[int, ...] = ()) -> None: ...

    def resume_missed(self, att: Attempt, source_gone: bool = True) -> None: ...

    def regain(self, sha256: str, lost: dict[str, int | None],
               silent: dict[str, float] | None = None) -> tuple[set[str], list[str]]: ...

log = logging.getLogger(__name__)

# a segment's error that is the request's fault, not the segment's: the client gets it (a 400),
# and no healthy peer is excluded or retried (the next chain would fail the same way)
REQUEST_FAULTS = {e.code: e for e in (InvalidRequest, Unsupported, ContextLengthExceeded)}
# the hop before a holder has no link to it (a holder back from a blip links to the coordinator
# before its neighbours): tried again after NEXT_HOP_RETRY_S while the wait lasts (found by CI: a
# 503 at once, or a wait, by which of them the holder relinked to first)
NEXT_HOP_RETRY_S = 1.0


def prefill_steps(start: int, end: int, segments: int) -> list[tuple[int, int]]:
    """A prefill of positions [start, end) as WORK steps [a, b) of equal sizes, sent back to back:
    at most PREFILL_CHUNK_TOKENS each, and on a chain at least one per segment while each keeps
    PIPELINE_MIN_CHUNK_TOKENS rows, so the segments work on different steps at once: 200 new tokens
    on 2 segments go as 2 steps of 100, the first segment computing the second while the next
    computes the first, where one step of 200 kept one of them idle at a time."""
    n = end - start
    if n <= 0:
        return []
    k = max(-(-n // const.PREFILL_CHUNK_TOKENS), min(segments, n // const.PIPELINE_MIN_CHUNK_TOKENS), 1)
    size, extra = divmod(n, k)  # sizes differ by one at most: none below n // k
    bounds = [start + i * size + min(i, extra) for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


class PipelineRun(Failover):
    """One request's distributed generation: yields tokens, re-plans on failure."""

    def __init__(self, coordinator: AttemptChannel, deadlines: StepDeadlines, perf: PeerPerformance,
                 job: GenerationJob, entry: ModelEntry, trace: RequestTrace, is_eog: Callable[[int], bool]):
        self.coordinator = coordinator  # opens, feeds and ends attempts
        self.deadlines = deadlines  # waits for a step under its ACK/RESULT deadlines
        self.perf = perf  # takes each completed step's telemetry
        self.job, self.entry, self.trace, self.is_eog = job, entry, trace, is_eog
        self.generated: list[int] = []
        self.attempt_no = 1
        self.attempt: Attempt | None = None
        # n-gram speculation over all attempts (each attempt drafts afresh); None: never speculated
        self.speculation: SpeculationStats | None = None
        # prompt tokens the current attempt did not prefill (a resumed kept session); None on a
        # whole holder's remote generate (its own cache, which it does not report)
        self.cached_tokens: int | None = None
        super().__init__()  # the failover bookkeeping: excluded, lost, silent, unreached, excused, ...

    async def tokens(self) -> AsyncIterator[list[int]]:
        """Sampled tokens, one per list, until EOG, max tokens or cancel."""
        coordinator = self.coordinator
        while True:
            att = self.attempt
            if att is None:
                att = self.attempt = await self.open()
            try:
                async for batch in self._generate(att):
                    yield batch
                coordinator.end(att, "session_end", keep=self._fed())
                self._log_segments()
                self._log_speculation()
                return
            except SegmentFailed as failure:
                coordinator.end(att, "session_end")
                # the request's own fault (its grammar cannot go on), said by the segment that samples
                # (where grammars run): no peer to route around; from any other, a failure as usual
                by_sampler = bool(att.route) and failure.node_id == att.route[-1].node_id
                fault = REQUEST_FAULTS.get(failure.cause) if by_sampler else None
                if fault is not None:
                    self._log_speculation()
                    raise fault(failure.message) from failure
                if att.resume is not None and failure.cause in ("kv_miss", "kv_position_mismatch"):
                    self._resume_missed(att, failure)
                elif failure.cause == SamplingUnsupported.code and by_sampler:  # (naming another node, as any
                    # failure: counted; review r60: uncounted, a peer naming others looped the request for ever)
                    self._sampling_refused(failure)
                else:
                    self._failed_over(att, failure)
            except GeneratorExit:  # the consumer stopped reading (EOG, stop sequence): a normal end
                coordinator.end(att, "session_end", keep=self._fed())
                self._log_speculation()
                raise
            except BaseException:  # cancelled (client gone) or failed: every segment stops and frees
                coordinator.end(att, "cancel")
                self._log_speculation()
                raise

    async def open(self) -> Attempt:
        """The next attempt on the cheapest chain without the excluded nodes. With none, while a
        holder's link dropped a moment ago (this request's, or a peer heard from within
        ROUTE_REGAIN_S that advertised the model), waits up to ROUTE_REGAIN_S for it to link again
        — a node this request lost is taken back on a new link — then InsufficientCapacity."""
        coordinator, trace = self.coordinator, self.trace
        waited_from = deadline = None
        waited_for: list[str] = []
        while True:
            relinked, awaited = coordinator.regain(self.entry.sha256, self.lost, self.silent)
            for node in relinked:  # linked anew: its sessions are gone, its layers usable again
                self.excluded.discard(node)
                del self.lost[node]
                self.silent.pop(node, None)
            for node, when in list(self.unreached.items()):
                if time.monotonic() - when >= NEXT_HOP_RETRY_S:  # its neighbours may have linked to it now
                    self.excluded.discard(node)
                    del self.unreached[node]
                else:
                    awaited = [*awaited, node]
            # silent ones that spoke again on their link: slow or back from a pause, not gone
            spoke = [n for n in self.silent if n not in awaited and n not in relinked]
            # a node left out for how it failed (a deadline, an error) is not waited for: it would
            # stay left out when it links again
            awaited = [n[:8] for n in awaited if n in self.lost or n in self.unreached or n not in self.excluded]
            try:
                att = coordinator.open_attempt(self.job, self.entry, trace, self.attempt_no, frozenset(self.excluded))
            except InsufficientCapacity as exc:
                # no route left because the holders were only busy (their queue full): the client
                # gets their 429 (Retry-After), not a 503 saying nobody holds the model
                if self.overloaded is not None and not self.generated:
                    raise Overloaded(self.overloaded.message) from exc
                now = time.monotonic()
                if deadline is None and awaited:
                    waited_from, deadline, waited_for = now, now + const.ROUTE_REGAIN_S, awaited
                    log.info("DIAG: pipeline waiting for a lost peer to link again %s", kv(
                        request_id=trace.request_id, peers=",".join(awaited), deadline_s=const.ROUTE_REGAIN_S,
                        error=exc.message))
                if spoke:  # no route without them: tried again (a 503 while they are there to serve
                    # was the end of a Wi-Fi blip or a short pause); a slow one fails again, MAX_ASSEMBLIES
                    log.info("DIAG: pipeline taking back a silent peer that spoke again %s", kv(
                        request_id=trace.request_id, peers=",".join(n[:8] for n in spoke)))
                    for node in spoke:
                        self.excluded.discard(node)
                        self.lost.pop(node, None)
                        del self.silent[node]
                    continue
                if deadline is None or not awaited:
                    if waited_from is not None:  # a wait begun and ended so counts too (found in review)
                        trace.note_regain_wait(now - waited_from, "gave_up")
                    if self.outdated is not None:  # the rest lack a field it uses: say which, not "no route"
                        raise SamplingUnsupportedBySwarm(f"{self.outdated.message}; no other node serving this "
                                                         "model can take the request") from exc
                    if self.excluded and self.last_failure:  # "held: nothing" alone hid who failed, and how
                        # (and beside older nodes left out before any work was sent, their HELLO
                        # listing no such feature: the field and nodes, and who failed: review r63)
                        kind = SamplingUnsupportedBySwarm if isinstance(exc, SamplingUnsupportedBySwarm) else \
                            InsufficientCapacity
                        raise kind(f"{exc.message}; left out after failing this request: "
                                   f"{', '.join(sorted(n[:8] for n in self.excluded))} "
                                   f"(last: {self.last_failure})", param=exc.param) from exc
                    raise
                if now >= deadline or self.job.cancel.is_set():  # (cancelled: the node stops, an unload)
                    trace.note_regain_wait(now - waited_from, "gave_up")
                    last = f" (last: {self.last_failure})" if self.last_failure else ""
                    # only older nodes left able to serve (their HELLO lists no such feature): the
                    # field and nodes, not to be retried, as without the wait (review r63: it was
                    # insufficient_capacity after ROUTE_REGAIN_S)
                    kind = SamplingUnsupportedBySwarm if isinstance(exc, SamplingUnsupportedBySwarm) else \
                        InsufficientCapacity
                    raise kind(f"{exc.message}; waited {now - waited_from:.0f} s for "
                               f"{', '.join(waited_for)} to link again{last}", param=exc.param) from exc
                try:
                    await asyncio.sleep(const.ROUTE_REGAIN_POLL_S)
                except asyncio.CancelledError:  # the client left (its handler cancelled): a wait
                    # cut short counts too (it was in no metric, and the trace said nothing of it);
                    # a request the node ended (its stop's drain, a forced unload: the job cancelled)
                    # whose handler is cancelled is the node giving up, not the client (a review)
                    waited = time.monotonic() - waited_from
                    ended = self.job.cancel.is_set()
                    trace.note_regain_wait(waited, "gave_up" if ended else "client_gone")
                    log.info("DIAG: pipeline wait for a lost peer ended: %s %s",
                             "the request was ended here" if ended else "the client left", kv(
                                 request_id=trace.request_id, peers=",".join(waited_for),
                                 waited_ms=round(waited * 1000)))
                    raise
                continue
            if waited_from is not None:
                trace.note_regain_wait(time.monotonic() - waited_from, "regained")
                log.info("DIAG: pipeline route regained %s", kv(
                    request_id=trace.request_id, waited_ms=round((time.monotonic() - waited_from) * 1000),
                    segments=att.plan.describe()))
            return att

    async def _generate(self, att: Attempt) -> AsyncIterator[list[int]]:
        """Prefill prompt + generated on this attempt's chain, then decode; yields new tokens."""
        if len(att.plan.segments) == 1 and att.plan.segments[0].whole:
            self.cached_tokens = None
            async for batch in self._generate_remote(att):
                yield batch
            return
        self.cached_tokens = att.cached
        job, generated, trace = self.job, self.generated, self.trace
        tokens = list(job.prompt_tokens) + generated
        last_step = None
        # from the kept prefix, if one is resumed
        for start, stop in prefill_steps(att.cached, len(tokens), len(att.plan.segments)):
            opens = start == att.cached  # the step that opens the sessions: what they are admitted for
            last_step = self.coordinator.send_step(att, job, tokens[start:stop], start, sample=stop == len(tokens),
                                                   history=tuple(generated), trace=trace,
                                                   resume=att.resume if opens else None,
                                                   expect=len(tokens) if opens else None)
        result = await self._token(att, last_step)
        drafter = self._drafter(tokens)
        draft: tuple[int, ...] = ()
        while True:
            new = [result.token]
            rewind = False
            if draft:  # a speculative step: the accepted draft, then the model's own token
                if not result.tokens or result.tokens[0] != result.token or len(result.tokens) > len(draft) + 1:
                    raise SegmentFailed("RESULT of a speculative step carries no verified tokens (that node's "
                                        "version does not verify drafts)", node_id=att.route[-1].node_id,
                                        cause="protocol")
                accepted = accept_count(list(draft), list(result.tokens))
                drafter.observe(len(draft), accepted)
                new = list(result.tokens[:accepted + 1])
                rewind = accepted < len(draft)  # the segments hold KV rows of the rejected draft tokens
            new = self._until_end(new, len(generated))
            generated.extend(new)
            step = None
            if not (self.is_eog(new[-1]) or len(generated) >= job.max_new_tokens or job.cancel.is_set()):
                # the next step goes out before the consumer gets these tokens: the segments compute
                # while the loop detokenizes and writes the stream (a stop sequence found there ends
                # the attempt with one step in vain; its KV row is cut when the kept chain resumes)
                index_pos = len(job.prompt_tokens) + len(generated) - 1
                draft = ()
                if drafter is not None:
                    drafter.extend(new)
                    draft = tuple(drafter.draft()[:job.max_new_tokens - len(generated) - 1])
                step = self.coordinator.send_step(att, job, [new[-1]], index_pos, sample=True, history=(),
                                                  trace=trace, draft=draft, rewind=rewind)
            yield new if result.scores is None else TokenBatch(new, [result.scores])
            if step is None or job.cancel.is_set():
                return
            result = await self._token(att, step)

    def _drafter(self, context: list[int]) -> NgramDrafter | None:
        """This attempt's n-gram drafter, or None when the request does not speculate (a fresh one
        per attempt: the failed attempt's backoff says nothing about the new chain)."""
        max_k = self.coordinator.speculative_max_draft
        if max_k <= 0:
            return None
        off = speculation_off_reason(self.job.params)
        if off is not None:
            if self.attempt_no == 1:
                log.debug("DIAG: n-gram speculation off for this request %s",
                          kv(request_id=self.trace.request_id, reason=off))
            return None
        if self.speculation is None:
            self.speculation = SpeculationStats()
        return NgramDrafter(context, max_k=max_k, stats=self.speculation)

    def _until_end(self, new: list[int], n_generated: int) -> list[int]:
        """`new` cut after its first end-of-generation token and to the request's max_tokens."""
        new = new[:max(1, self.job.max_new_tokens - n_generated)]
        for i, token in enumerate(new):
            if self.is_eog(token):
                return new[:i + 1]
        return new

    async def _generate_remote(self, att: Attempt) -> AsyncIterator[list[int]]:
        """The holder of the whole model generates from prompt + generated; yields its batches."""
        job, generated = self.job, self.generated
        holder = att.plan.segments[0]
        stream = self.coordinator.start_remote(att, job, list(job.prompt_tokens) + generated,
                                               job.max_new_tokens - len(generated))
        last_at = stream.sent_at
        while True:
            msg = await stream.next()
            if msg.tokens:
                now = time.monotonic()
                self._account_remote(holder.node_id, holder.end, msg, (now - last_at) * 1000)
                last_at = now
                batch = self._until_end(list(msg.tokens), len(generated))
                if job.params.logprobs is not None and not msg.scores:
                    raise SegmentFailed(f"TOKENS from {holder.node_id[:8]} carry no logprobs (its version does "
                                        "not compute them)", node_id=holder.node_id, cause="protocol")
                generated.extend(batch)
                yield TokenBatch(batch, list(msg.scores[:len(batch)])) if msg.scores else batch
                if self.is_eog(batch[-1]) or len(generated) >= job.max_new_tokens:
                    stream.finishing = True  # it stops there too: no cancel (2026-12-07: a cancel raced its end)
                    return
                if job.cancel.is_set():
                    return
            if msg.end in ("eog", "length"):
                return
            if msg.end is not None:  # an error, or cancelled by the holder itself (its model unloaded)
                raise SegmentFailed(msg.error or f"the holder ended the generation ({msg.end})",
                                    node_id=holder.node_id, cause=msg.error_code or msg.end)

    def _account_remote(self, node_id: str, n_layers: int, msg: Tokens, wall_ms: float) -> None:
        """A TOKENS batch's cost: the trace's one segment, and (decode batches: not the first,
        which includes prefill) the holder's ms per token into the peer's performance."""
        seg = self.trace.segments[0] if self.trace.segments else None
        if seg is not None:
            seg.elapsed_ms += msg.eval_us / 1000
            seg.telemetry["eval_us"] = seg.telemetry.get("eval_us", 0) + msg.eval_us
        if msg.first > 0 and msg.eval_us > 0:
            self.perf.observe_whole(node_id, n_layers, msg.eval_us, len(msg.tokens), wall_ms)

    async def _token(self, att: Attempt, step: Step) -> Result:
        """The step's RESULT, with its sampled token (and its logprobs when the request asked for
        them); SegmentFailed naming the node to route around."""
        result = await self.deadlines.wait(att, step, self.trace)
        if result.error is not None:
            raise SegmentFailed(result.error, node_id=result.failed_node or att.route[0].node_id,
                                cause=result.error_code or "error")
        self._account(att, step, result)
        if result.token is None:
            raise SegmentFailed("RESULT of a sampling step carries no token", node_id=att.route[-1].node_id,
                                cause="protocol")
        if self.job.params.logprobs is not None and result.scores is None:
            raise SegmentFailed("RESULT carries no logprobs (that node's version does not compute them)",
                                node_id=att.route[-1].node_id, cause="protocol")
        return result

    def _account(self, att: Attempt, step: Step, result: Result) -> None:
        """A completed step's telemetry: segment 0's KV length, the trace's per-segment figures,
        the peers' performance and the hop overhead."""
        wall_ms = (time.monotonic() - step.sent_at) * 1000
        if result.telemetry and "kv_len" in result.telemetry[0]:
            att.kv_len = int(result.telemetry[0]["kv_len"])
        add_segment_telemetry(self.trace, result.telemetry)
        # network hops: between consecutive segments (always two nodes), plus into the first
        # and back from the last when those are not this node
        hops = len(att.route) - 1 + (att.kinds[0] != "local") + (att.kinds[-1] != "local") if att.route else 0
        self.perf.observe_step(result.telemetry, step.n_tokens, wall_ms, hops, att.nodes())
        att.steps.pop(step.seq, None)

    def _fed(self) -> tuple[int, ...]:
        """The tokens whose KV the attempt's sessions hold: prompt and generated, less the last
        sampled token (never fed; rejected draft rows beyond are cut when they are resumed)."""
        return (*self.job.prompt_tokens, *self.generated)[:-1]

    def _log_segments(self) -> None:
        trace = self.trace
        for i, seg in enumerate(trace.segments):  # seed 000 markers: local / remote segment complete
            log.debug("DIAG: %s segment complete %s", "local" if seg.transport == "local" else "remote", kv(
                request_id=trace.request_id, seg=i, node=seg.node_short_id, layers=f"{seg.layer_start}-{seg.layer_end - 1}",
                segment_ms=round(seg.elapsed_ms, 1), activation_bytes=seg.activation_bytes, transport=seg.transport))
        log.debug("DIAG: pipeline run complete %s", kv(
            request_id=trace.request_id, tokens=len(self.generated), assemblies=trace.assemblies))

    def _log_speculation(self) -> None:
        """The local route's seed-000 summary line, for a chain (over all its attempts), once."""
        stats, self.speculation = self.speculation, None
        if stats is not None:
            log.debug("DIAG: pipeline n-gram speculation complete %s",
                      kv(request_id=self.trace.request_id, segments=len(self.trace.segments), **stats.as_kv()))

    def close(self) -> None:
        """Free whatever the current attempt holds (idempotent)."""
        if self.attempt is not None:
            self.coordinator.end(self.attempt, "cancel")
