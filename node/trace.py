"""RequestTrace: the one record of a request that every surface reads.

The pipeline writes a trace once; the log summary line, the response headers, the diagnostics
rings, the Prometheus histograms and the GUI's request table all read it and never re-measure.
Absent fields mean "not measured", never zero.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node import const
from node.errors import NodeError
from node.logs import clean_text, cut_for_redaction, kv
from node.observe import Observers

log = logging.getLogger(__name__)
UNKNOWN_MODEL = "<unknown model>"  # in the report, for a model name the node did not recognise
REQUEST_RATE_WINDOW_S = 60.0  # finished requests counted for requests_last_minute

ROUTES = ("local", "split", "distributed", "relayed")


def _ms(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start) * 1000.0)


def _round(value: float | None) -> int | float | None:
    if value is None:
        return None
    return int(round(value)) if value >= 10 else round(value, 1)


@dataclass
class SegmentTrace:
    """One hop of a route: which node ran which layers, and what it cost."""

    node_short_id: str
    layer_start: int
    layer_end: int  # exclusive
    transport: str = "local"  # local | direct | relayed
    elapsed_ms: float = 0.0
    activation_bytes: int = 0
    telemetry: dict[str, Any] = field(default_factory=dict)  # eval_us, wait_us, send_us, ...

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return dataclasses.asdict(self)


@dataclass
class RequestTrace:
    """Everything known about one request; timestamps are time.monotonic() seconds."""

    model: str
    operation: str  # chat.completions | completions | embeddings | rerank
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    route: str | None = None  # set when a route is assembled
    resolved: bool = False  # `model` is a catalog id (not just what the client typed)
    stream: bool = False
    created_at: float = field(default_factory=time.time)  # wall clock, for display
    admitted: float = field(default_factory=time.monotonic)
    dequeued: float | None = None
    assembled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    sched_s: float = 0.0  # time spent assembling, summed across attempts
    assemblies: int = 0  # routes chosen (attempts), not planning tries that found none
    segments: list[SegmentTrace] = field(default_factory=list)
    regions: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens whose KV was reused (prefix cache), when known
    completion_tokens: int = 0  # with `n` choices, theirs together (OpenAI's usage)
    choices: int = 1  # OpenAI's `n`: the choices this request's reply holds (node.inference.choices)
    # with `n` choices, the longest one's tokens: they decode side by side, so the decode time is its
    longest_choice_tokens: int | None = None
    reasoning_tokens: int = 0  # of completion_tokens, those of a reasoning model's thoughts
    finish_reason: str | None = None  # stop | length | tool_calls
    finish_detail: str | None = None  # eos | stop_sequence | max_tokens | context
    outcome: str | None = None  # ok | error | cancelled | stalled (a client that took nothing, cut off)
    error_type: str | None = None
    error_message: str | None = None
    error_status: int | None = None  # the HTTP status the error got (4xx: the client's request was wrong)
    error_code: str | None = None
    error_param: str | None = None
    first_attempt_cause: str | None = None
    failure_causes: list[str] = field(default_factory=list)  # each failed attempt's cause, in order
    # (seconds, outcome) per wait for a lost peer: regained | gave_up | client_gone
    regain_waits: list[tuple[float, str]] = field(default_factory=list)
    # with `n` choices that went different ways (one failed over, say): each choice's (route, nodes);
    # empty when every choice took choice 0's route (node.inference.choices)
    choice_routes: list[tuple[str | None, list[str]]] = field(default_factory=list)

    # --- phase marks (written by the pipeline) ---

    def mark_dequeued(self) -> None:
        """The request got its turn on the model."""
        self.dequeued = time.monotonic()

    def begin_assembly(self) -> float:
        """Start choosing a route; returns the start time for end_assembly."""
        return time.monotonic()

    def end_assembly(self, started: float, segments: list[SegmentTrace] | None = None) -> None:
        """Route planning ended: adds to sched time. `segments`: a route was chosen (one attempt),
        counted in `assemblies`; None: none could be (no holder left: a wait for a lost peer plans
        again every ROUTE_REGAIN_POLL_S), which is no assembly (2026-12-07: each such check counted
        one: a 15 s wait, about 75 on the summary line). ttft runs from the first planning's end (a
        wait for a lost peer is in it: queue + sched + ttft + decode ≈ total): a failover's later one
        (after tokens were streamed, maybe) does not move it."""
        now = time.monotonic()
        self.sched_s += now - started
        if self.assembled is None:
            self.assembled = now
        if segments is None:
            return
        self.assemblies += 1
        self.segments = segments

    def note_failure(self, cause: str, message: str) -> None:
        """An attempt failed on a peer (the request fails over, or fails): /metrics counts causes."""
        if self.first_attempt_cause is None:
            self.first_attempt_cause = f"{cause}: {message}"
        self.failure_causes.append(cause)

    def note_regain_wait(self, seconds: float, outcome: str) -> None:
        """The request waited for a lost peer to link again (ROUTE_REGAIN_S at most); `outcome`:
        regained, gave_up (also: the node ended the request meanwhile, its stop or a forced unload),
        or client_gone (the client left while it waited)."""
        self.regain_waits.append((seconds, outcome))

    def mark_token(self, n: int = 1) -> None:
        """n completion tokens were produced."""
        if self.first_token is None:
            self.first_token = time.monotonic()
        self.completion_tokens += n

    # --- derived figures ---

    @property
    def queue_ms(self) -> float | None:
        return _ms(self.admitted, self.dequeued)

    @property
    def sched_ms(self) -> float | None:
        return self.sched_s * 1000.0 if self.assemblies or self.sched_s else None

    @property
    def ttft_ms(self) -> float | None:
        """From the route being ready to the first token (queue and sched are separate)."""
        return _ms(self.assembled, self.first_token)

    @property
    def decode_ms(self) -> float | None:
        if self.first_token is None or self.finished is None:
            return None
        return _ms(self.first_token, self.finished)

    @property
    def total_ms(self) -> float | None:
        return _ms(self.admitted, self.finished)

    @property
    def reply_tokens(self) -> int:
        """The tokens the decode time was spent on, one a step: the reply's, or with `n` choices (side
        by side, one token each a step) the longest one's."""
        return self.longest_choice_tokens if self.choices > 1 and self.longest_choice_tokens else self.completion_tokens

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token of one reply: the decode time over the reply's tokens; with `n`
        choices the longest one's, the decode time running to its end (2026-12-07: over all their
        tokens n=4 read a quarter of it; then over their mean count, choices of unequal length read
        about twice it, review r64)."""
        decode, tokens = self.decode_ms, self.reply_tokens
        if decode is None or tokens < 2:
            return None
        return decode / (tokens - 1)

    @property
    def tok_per_sec(self) -> float | None:
        """Decode speed of one reply (the summary line, the Requests tab's tok/s, /api/status): its
        tokens, the first included, over the decode time (first token to last), as seed 000's summary
        line has it (tokens=48 decode_ms=1420 tok_per_sec=33.8; tpot_ms=30.2 divides by the 47 gaps, so
        this is not 1000 / tpot_ms); with `n` choices the longest one's (2026-12-07: every choice's, n
        times a reply's speed)."""
        decode, tokens = self.decode_ms, self.reply_tokens
        if decode is None or decode <= 0 or tokens < 2:
            return None
        return tokens / (decode / 1000.0)

    @property
    def activation_bytes(self) -> int | None:
        if not any(s.activation_bytes for s in self.segments):
            return None
        return sum(s.activation_bytes for s in self.segments)

    @property
    def node_ids(self) -> list[str]:
        return [s.node_short_id for s in self.segments]

    @property
    def peer_count(self) -> int:
        return len({s.node_short_id for s in self.segments if s.transport != "local"})

    @property
    def done(self) -> bool:
        return self.finished is not None

    # --- surfaces ---

    def summary_line(self, *, public: bool = False) -> str:
        """The `DIAG: request complete …` line (seed 000 format, and `op=` the API operation: a rerank
        line read as a chat that produced no tokens). `public` (the diagnostics report): a model
        name the node did not recognise is the client's text, not shown. `n` choices that went
        different ways: `route=mixed`, `nodes=` every choice's, `choice_routes=` each one's, and no
        per-segment figures (they were choice 0's alone, 2026-12-07)."""
        mixed = bool(self.choice_routes)
        nodes = list(dict.fromkeys(n for _, ids in self.choice_routes for n in ids)) if mixed else self.node_ids
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "route": "mixed" if mixed else self.route,
            "segments": None if mixed else len(self.segments) or None,
            "assemblies": self.assemblies if self.assemblies > 1 else None,
            "model": self.model if self.resolved or not public or not self.model else UNKNOWN_MODEL,
            "op": self.operation or None,  # rerank, embeddings, messages, responses...: one kind of line each
            "nodes": ",".join(nodes) or None,
            "choice_routes": "|".join(f"{route or 'none'}:{','.join(ids) or '-'}" for route, ids in self.choice_routes)
            or None,
            "regions": None if mixed else ",".join(self.regions) or None,
            "queue_ms": _round(self.queue_ms),
            "sched_ms": _round(self.sched_ms),
            "ttft_ms": _round(self.ttft_ms),
            "decode_ms": _round(self.decode_ms),
            "total_ms": _round(self.total_ms),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "tokens": self.completion_tokens if self.assemblies else None,
            "choices": self.choices if self.choices > 1 else None,  # `tokens` is all choices' together
            "tok_per_sec": round(self.tok_per_sec, 1) if self.tok_per_sec is not None else None,
            "tpot_ms": round(self.tpot_ms, 1) if self.tpot_ms is not None else None,
        }
        for i, seg in enumerate([] if mixed else self.segments):
            if seg.transport != "local" or len(self.segments) > 1:
                fields[f"seg{i}_ms"] = _round(seg.elapsed_ms)
        fields["activation_bytes"] = None if mixed else self.activation_bytes
        fields["finish_reason"] = self.finish_reason
        fields["outcome"] = self.outcome
        fields["error_type"] = self.error_type
        return "DIAG: request complete " + kv(**fields)

    def headers(self, *, streaming: bool = False) -> dict[str, str]:
        """x-swarm-* and server-timing; a stream gets only what is known before the body."""
        out = {"x-request-id": self.request_id}
        if self.route is not None:
            out.update({
                "x-swarm-route": self.route,
                "x-swarm-segments": str(len(self.segments)),
                "x-swarm-peers": str(self.peer_count),
                "x-swarm-nodes": ",".join(self.node_ids),
            })
        timing = [("queue", self.queue_ms), ("sched", self.sched_ms)]
        if not streaming:
            timing += [("ttft", self.ttft_ms), ("decode", self.decode_ms), ("total", self.total_ms)]
        parts = [f"{name};dur={value:.1f}" for name, value in timing if value is not None]
        if parts:
            out["server-timing"] = ", ".join(parts)
        return out

    def public_error(self, redact: Callable[[str], str] | None = None) -> str | None:
        """The error as the diagnostics report shows it. A client error's message quotes the
        request (a model name, a schema's fragment, a pattern), so only its type, code and param
        are shown: the client has the message. The node's own errors keep theirs (one line,
        bounded; `redact`, the report's redactor, runs on it before it is made one line)."""
        if self.error_type is None and self.error_message is None:
            return None
        if self.error_status is not None and 400 <= self.error_status < 500:
            detail = ", ".join(f"{k}={v}" for k, v in (("status", self.error_status), ("code", self.error_code),
                                                         ("param", self.error_param)) if v is not None)
            return clean_text(f"{self.error_type} ({detail}; the message went to the client)", 300)
        message = self.error_message or ""
        if redact is not None:  # bounded before the redactor reads it (review r67)
            message = cut_for_redaction(message, 300)
        if not self.resolved and self.model:  # the name as a whole word (a name "a" must not mangle the text)
            message = re.sub(rf"(?<![\w.-]){re.escape(self.model)}(?![\w-]|\.\w)", UNKNOWN_MODEL, message)
        if redact is not None:  # before it is escaped: `\n/home/ana` is no path to a redactor (review r64)
            message = redact(message)
        return clean_text(f"{self.error_type}: {message}" if self.error_type else message, 300)

    def timings(self) -> dict[str, Any]:
        """Figures for the final SSE event and JSON surfaces (absent → omitted)."""
        data = {
            "route": self.route,
            "segments": len(self.segments),
            "nodes": self.node_ids,
            "queue_ms": self.queue_ms,
            "sched_ms": self.sched_ms,
            "ttft_ms": self.ttft_ms,
            "decode_ms": self.decode_ms,
            "total_ms": self.total_ms,
            "tpot_ms": self.tpot_ms,
            "tok_per_sec": self.tok_per_sec,
        }
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in data.items() if v is not None}

    def as_dict(self) -> dict[str, Any]:
        """JSON view for /api/admin/requests and the GUI."""
        return {
            "request_id": self.request_id,
            "model": self.model,
            "operation": self.operation,
            "route": self.route,  # (n choices that went different ways: the first's; each in choice_routes)
            "choice_routes": [{"route": route, "nodes": list(ids)} for route, ids in self.choice_routes],
            "stream": self.stream,
            "created_at": self.created_at,
            "assemblies": self.assemblies,
            "segments": [s.as_dict() for s in self.segments],
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "finish_detail": self.finish_detail,
            "outcome": self.outcome,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "failure_causes": list(self.failure_causes),
            "regain_waits": [{"seconds": round(sec, 3), "outcome": how} for sec, how in self.regain_waits],
            **{k: v for k, v in self.timings().items() if k not in ("route", "segments", "nodes")},
            "summary": self.summary_line() if self.done else None,
        }


Observer = Callable[[str, RequestTrace], None]


# the outcomes the failure ring keeps: an error, and a stream the node cut off because its client
# took nothing for STREAM_WRITE_STALL_S (2026-12-07, review r25: that one ended `cancelled`, out of it)
FAILED_OUTCOMES = ("error", "stalled")


class TraceHub:
    """Owns the in-flight set, the recent and failure rings, and observers.

    Events passed to observers: "started", "first_token", "finished". Observers are called on
    the event loop thread and must not block.
    """

    def __init__(self, metrics: Any | None = None):
        self._in_flight: dict[str, RequestTrace] = {}
        self.recent: collections.deque[RequestTrace] = collections.deque(maxlen=const.TRACE_RING_SIZE)
        self.failures: collections.deque[RequestTrace] = collections.deque(maxlen=const.FAILURE_RING_SIZE)
        self._observers: Observers[[str, RequestTrace]] = Observers("trace")
        self.metrics = metrics
        self.counts: collections.Counter[str] = collections.Counter()
        # created_at of the requests finished in about the last minute (the recent ring holds only
        # TRACE_RING_SIZE traces: a count over it stopped at that many)
        self._finished_created: collections.deque[float] = collections.deque()

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Call observer(event, trace) on every event; returns a function that unsubscribes it."""
        return self._observers.subscribe(observer)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def in_flight_traces(self) -> list[RequestTrace]:
        return list(self._in_flight.values())

    async def async_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight, at most `timeout_s`; True when none is."""
        if not self._in_flight:
            return True
        idle = asyncio.Event()
        unsubscribe = self.subscribe(lambda event, _t: idle.set() if event == "finished" and not self._in_flight
                                     else None)
        try:
            async with asyncio.timeout(timeout_s):
                await idle.wait()
        except TimeoutError:
            pass
        finally:
            unsubscribe()
        return not self._in_flight

    def finished_since(self, since: float) -> int:
        """How many finished requests were created at or after `since` (wall clock, within the last
        REQUEST_RATE_WINDOW_S)."""
        self._trim_finished()
        return sum(1 for t in self._finished_created if t >= since)

    def _trim_finished(self) -> None:
        cutoff = time.time() - REQUEST_RATE_WINDOW_S
        while self._finished_created and self._finished_created[0] < cutoff:
            self._finished_created.popleft()

    def in_flight_for_model(self, model_id: str) -> int:
        return sum(1 for t in self._in_flight.values() if t.model == model_id)

    def start(self, trace: RequestTrace) -> RequestTrace:
        """Register a new request."""
        self._in_flight[trace.request_id] = trace
        self.counts["started"] += 1
        self._observers.emit("started", trace)
        return trace

    def first_token(self, trace: RequestTrace) -> None:
        """Tell observers the first token arrived (the pipeline calls it once)."""
        self._observers.emit("first_token", trace)

    def finish(
        self,
        trace: RequestTrace,
        outcome: str,
        *,
        error: NodeError | None = None,
        error_type: str | None = None,
        error_message: str | None = None,
    ) -> None:
        """Close the trace exactly once: summary line, rings, metrics, observers. `error`: the
        NodeError the client got (its type, message, status, code and param are recorded)."""
        if error is not None:
            error_type, error_message = type(error).__name__, error.message
            trace.error_status, trace.error_code, trace.error_param = error.http_status, error.code, error.param
        if trace.request_id not in self._in_flight and trace.done:
            return
        self._in_flight.pop(trace.request_id, None)
        if trace.finished is None:
            trace.finished = time.monotonic()
        trace.outcome = outcome
        trace.error_type = error_type
        trace.error_message = error_message
        self.counts[outcome] += 1
        self.recent.append(trace)
        self._finished_created.append(trace.created_at)
        self._trim_finished()
        # a client closing its request is no failure: an editor's autocomplete cancelled 50 in a few
        # seconds, pushing every real one out; a client the node cut off (stalled) is one to look at
        if outcome in FAILED_OUTCOMES:
            self.failures.append(trace)
        line = trace.summary_line()
        if outcome == "error":
            log.warning(line)
        else:
            log.info(line)
        if self.metrics is not None:
            self.metrics.observe_trace(trace)
        self._observers.emit("finished", trace)
