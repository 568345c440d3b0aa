"""The live request table, fed by RequestTrace observer events ("started", "first_token", "finished").

Rows are the trace objects themselves (the one source of truth): the table shows what the
pipeline wrote and never re-measures. `SegmentsModel` shows one trace's route, hop by hop.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer

from app.ui import fmt
from app.ui.table_model import Column, KeyedTableModel
from node.trace import RequestTrace, SegmentTrace

MAX_ROWS = 500  # the table keeps this many requests (the node's own ring keeps 50)


def outcome_text(t: RequestTrace) -> str:
    if not t.done:
        return "in flight"
    if t.outcome == "error":  # its message, in words (the class name read "error: InsufficientCapacity")
        words = (t.error_message or "").strip().splitlines()
        return f"error: {words[0]}" if words else (f"error: {t.error_type}" if t.error_type else "error")
    if t.outcome == "ok" and t.finish_reason == "length":  # which limit cut it: the fix differs
        return f"ok · {LENGTH_WORDS.get(t.finish_detail or '', LENGTH_WORDS['max_tokens'])}"
    if t.outcome == "ok" and t.finish_reason in FINISH_WORDS:
        return f"ok · {FINISH_WORDS[t.finish_reason]}"
    return t.outcome or fmt.DASH


def _outcome_color(t: RequestTrace) -> str | None:
    return fmt.STATE_COLORS.get("in flight" if not t.done else (t.outcome or ""))


# what the client asked for, as its API names it (the trace's `operation`)
OPERATIONS = {"chat.completions": "chat", "completions": "completion", "completion": "completion",
              "messages": "chat (Anthropic)", "messages.count_tokens": "count tokens", "responses": "responses",
              "infill": "infill", "embeddings": "embeddings", "rerank": "rerank",
              "ollama.chat": "chat (Ollama)", "ollama.generate": "generate (Ollama)"}
NO_COMPLETION = ("embeddings", "rerank", "messages.count_tokens")  # they read tokens and generate none
FINISH_WORDS = {"tool_calls": "tool calls"}  # worth saying beside "ok"
# a reply cut short, by what (the trace's finish_detail): a full context wants a larger context, not
# a larger max_tokens (found in review, 2026-12-06: every one read "cut at max tokens")
LENGTH_WORDS = {"max_tokens": "cut at max tokens", "context": "cut: context full", "time_limit": "cut: time limit"}


def operation_text(t: RequestTrace) -> str:
    return OPERATIONS.get(t.operation, t.operation or fmt.DASH)


def _tokens(t: RequestTrace) -> str:
    prompt = fmt.DASH if t.prompt_tokens is None else str(t.prompt_tokens)
    if t.operation in NO_COMPLETION:
        return f"{prompt} in"
    if t.cached_tokens:  # the prefix cache's share of the prompt
        prompt += f" ({t.cached_tokens} cached)"
    completion = str(t.completion_tokens)
    if t.reasoning_tokens:
        completion += f" ({t.reasoning_tokens} thinking)"
    return f"{prompt} → {completion}"


def _nodes(t: RequestTrace) -> str:
    return ",".join(t.node_ids) or fmt.DASH


REQUEST_COLUMNS = [
    Column("Time", lambda t: fmt.clock(t.created_at), header_tip="when the request arrived (local time)"),
    Column("Request", lambda t: t.request_id[:8], tooltip=lambda t: t.request_id, header_tip="the request id (x-request-id), first 8 digits"),
    Column("Model", lambda t: t.model, header_tip="the model the request named"),
    Column("Operation", operation_text, tooltip=lambda t: t.operation,
           header_tip="what was asked: chat, completion, embeddings, rerank… (the API's endpoint)"),
    Column("Route", lambda t: (t.route or (fmt.DASH if t.done else "choosing")) + (f" ×{t.assemblies}" if t.assemblies > 1 else ""),
           tooltip=lambda t: f"{len(t.segments)} segment(s), {t.peer_count} peer(s)",
           header_tip="local, split, distributed or relayed (×N: assembled N times, i.e. retried)"),
    Column("Nodes", _nodes, header_tip="short ids of the nodes that ran the segments"),
    Column("TTFT", lambda t: fmt.ms(t.ttft_ms), numeric=True,
           header_tip="time to first token, from the route being ready"),
    Column("tok/s", lambda t: fmt.rate(t.tok_per_sec), numeric=True,
           header_tip="decode speed of one reply: its tokens over the time from its first token to its last, "
                      "as the log's summary line (n choices: the longest one's, as they decode side by side)"),
    Column("Tokens", _tokens, numeric=True, header_tip="prompt → completion tokens (cached: prompt tokens the prefix cache reused; "
                                                          "thinking: a reasoning model's; embeddings and rerank read only)"),
    Column("Outcome", outcome_text, color=_outcome_color,
           tooltip=lambda t: (f"{t.error_message}\n({t.error_type})" if t.error_message and t.error_type
                              else t.error_message or t.finish_detail or t.finish_reason),
           header_tip="ok, in flight, cancelled or error (hover for why it ended)"),
]


class RequestsModel(KeyedTableModel):
    """Newest request first; one row per RequestTrace."""

    def __init__(self, parent=None, *, max_rows: int = MAX_ROWS):
        super().__init__(REQUEST_COLUMNS, newest_first=True, max_rows=max_rows, parent=parent)
        self._in_flight: set[str] = set()
        # In-flight rows change without an event (token counts); refresh only those, only while
        # there are any. The data shown is still the trace the observer handed over.
        self._ticker = QTimer(self)
        self._ticker.setInterval(500)
        self._ticker.timeout.connect(self._tick)

    def on_trace_event(self, event: str, trace: RequestTrace) -> None:
        """TraceHub observer (runs on the loop thread, which is the Qt thread under qasync)."""
        key = trace.request_id
        if event == "started":
            self._in_flight.add(key)
            self.upsert(key, trace)
        else:  # a row trimmed away while in flight stays away
            if event == "finished":
                self._in_flight.discard(key)
            self.refresh(key)
        if self._in_flight and not self._ticker.isActive():
            self._ticker.start()
        elif not self._in_flight:
            self._ticker.stop()

    def _tick(self) -> None:
        rows = []
        for key in list(self._in_flight):
            row = self.row_of(key)
            if row < 0:  # trimmed away
                self._in_flight.discard(key)
            else:
                rows.append(row)
        if rows:  # one change over the in-flight rows (the newest, at the top): the views
            # re-measure their columns once per change, not once per in-flight row
            self.dataChanged.emit(self.index(min(rows), 0), self.index(max(rows), len(self.columns) - 1))
        if not self._in_flight:
            self._ticker.stop()

    def trace(self, key: str) -> RequestTrace | None:
        return self.value(key)


def _telemetry(s: SegmentTrace) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(s.telemetry.items())) or fmt.DASH


SEGMENT_COLUMNS = [
    Column("#", lambda s: str(s[0]), numeric=True, header_tip="the hop's place in the chain"),
    Column("Node", lambda s: s[1].node_short_id, header_tip="the node that ran these layers"),
    Column("Layers", lambda s: fmt.layers([s[1].layer_start, s[1].layer_end]),
           header_tip="the layers this node ran (inclusive)"),
    Column("Transport", lambda s: s[1].transport, header_tip="local, direct TLS link, or relayed"),
    Column("Elapsed", lambda s: fmt.ms(s[1].elapsed_ms) if s[1].elapsed_ms else fmt.DASH, numeric=True, header_tip="time spent on this hop for the whole request"),
    Column("Activations", lambda s: fmt.size(s[1].activation_bytes) if s[1].activation_bytes else fmt.DASH,
           numeric=True, header_tip="hidden-state bytes sent to the next hop"),
    Column("Telemetry", lambda s: _telemetry(s[1]), header_tip="the hop's own figures: compute (eval), waiting and sending times"),
]


class SegmentsModel(KeyedTableModel):
    """The segments of one selected request."""

    def __init__(self, parent=None):
        super().__init__(SEGMENT_COLUMNS, parent=parent)

    def show_trace(self, trace: RequestTrace | None) -> None:
        segments = trace.segments if trace is not None else []
        self.replace_all((i, (i, seg)) for i, seg in enumerate(segments))
