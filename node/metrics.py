"""Prometheus metrics, one registry per node (several nodes can share a process in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from node import errors
from node.trace import RequestTrace

# Prometheus' base unit is the second (`_seconds`): dashboards and `histogram_quantile` expect it.
_S_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1)

# swarmllm_failovers' causes: how a segment failed (pipeline/run.py, coordinator.py, deadlines.py)
# or the error code a peer answered with (any NodeError's)
FAILURE_CAUSES = frozenset({"link_drop", "unreachable", "protocol", "error", "ack_deadline", "result_deadline",
                            "tokens_deadline", "deadline", "cancelled", "self_paused"} | {
    c.code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.NodeError)})

# the outcomes of requests that ended before their reply did (node/trace.py: outcome)
CUT_SHORT = frozenset({"cancelled", "stalled"})


class NodeMetrics:
    """Histograms and counters fed by finished RequestTraces (never re-measured)."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model", "route")
        self.queue_s = Histogram("swarmllm_queue_seconds", "Time waiting for the model", labels,
                                 buckets=_S_BUCKETS, registry=self.registry)
        self.ttft_s = Histogram("swarmllm_ttft_seconds", "Route ready to first token", labels,
                                buckets=_S_BUCKETS, registry=self.registry)
        self.tpot_s = Histogram("swarmllm_time_per_output_token_seconds", "Time per output token after the first "
                                "(not of a reply cut mid-way)",
                                labels, buckets=_TPOT_BUCKETS, registry=self.registry)
        self.total_s = Histogram("swarmllm_request_duration_seconds", "Whole request (not a reply its client left or "
                                 "the node cut off mid-way: swarmllm_requests' outcome counts those)", labels,
                                 buckets=_S_BUCKETS, registry=self.registry)
        self.requests = Counter("swarmllm_requests", "Finished requests", ("model", "route", "outcome"),
                                registry=self.registry)
        # the HTTP status an error got (a fixed set: 400, 404, 409, 429, 500, 503, ...): a client's
        # bad requests, an overload and the node's own failures are told apart
        self.errors = Counter("swarmllm_request_errors", "Requests that ended with an error, by HTTP status",
                              ("model", "route", "status"), registry=self.registry)
        self.prompt_tokens = Counter("swarmllm_prompt_tokens", "Prompt tokens of requests given a route "
                                     "(a prompt refused before one, too long or overloaded, is not processed)",
                                     labels, registry=self.registry)
        self.completion_tokens = Counter("swarmllm_completion_tokens", "Tokens generated", labels,
                                         registry=self.registry)
        # A peer failing a request mid-way (the request leaves it for another route, or fails when
        # none is left) and the waits for a lost peer to link again: before, in logs and traces only.
        self.failovers = Counter("swarmllm_failovers", "Attempts that failed on a peer (the request "
                                 "failed over, or failed with none left), by cause", ("model", "route", "cause"),
                                 registry=self.registry)
        self.regain_wait_s = Histogram("swarmllm_route_regain_wait_seconds", "Waits for a lost peer to link "
                                       "again (outcome: regained, gave_up or client_gone)", ("model", "route", "outcome"),
                                       buckets=_S_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("swarmllm_in_flight_requests", "Requests being served", registry=self.registry)

    def observe_trace(self, trace: RequestTrace) -> None:
        """Record a finished trace."""
        # Unresolved names are client input: one fixed label, so junk cannot grow the series set.
        key = (trace.model if trace.resolved else "unknown", trace.route or "none")
        # a reply its client left (cancelled) or the node cut off (stalled) mid-way ended then, not
        # when it would have: its duration and time per token are no latency samples (they pulled
        # p50/p95 down, 2026-12-07); it is counted in swarmllm_requests{outcome}, as vLLM's
        # finished_reason="abort". Its queue wait and first token, measured before it left, are; so is
        # the duration of one cut before its first token (a user who gave up after 90 s in the queue
        # waited that long: review r42, it was in no histogram) or after its reply ended (the client
        # closed at the last write: a whole reply's true duration).
        cut = trace.outcome in CUT_SHORT and trace.first_token is not None and trace.finish_reason is None
        for hist, ms in ((self.queue_s, trace.queue_ms), (self.ttft_s, trace.ttft_ms),
                         (self.tpot_s, None if cut else trace.tpot_ms), (self.total_s, None if cut else trace.total_ms)):
            if ms is not None:
                hist.labels(*key).observe(ms / 1000)
        self.requests.labels(*key, trace.outcome or "unknown").inc()
        if trace.outcome == "error":
            self.errors.labels(*key, str(trace.error_status or 500)).inc()
        if trace.prompt_tokens and trace.route is not None:
            self.prompt_tokens.labels(*key).inc(trace.prompt_tokens)
        if trace.completion_tokens:
            self.completion_tokens.labels(*key).inc(trace.completion_tokens)
        for cause in trace.failure_causes:  # a peer's error code is its word: a fixed set, or "other"
            self.failovers.labels(*key, cause if cause in FAILURE_CAUSES else "other").inc()
        for seconds, outcome in trace.regain_waits:
            self.regain_wait_s.labels(*key, outcome).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """Exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
