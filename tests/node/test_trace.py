"""RequestTrace: one record, read by every surface; absent means not measured."""

import logging

from node.trace import RequestTrace, SegmentTrace, TraceHub


def _trace(**kw) -> RequestTrace:
    t = RequestTrace(model="m-1234abcd", operation="chat.completions", **kw)
    t.admitted = 100.0
    return t


def _finished_trace() -> RequestTrace:
    t = _trace()
    t.dequeued = 100.003
    t.sched_s, t.assemblies, t.assembled = 0.001, 1, 100.004
    t.route = "local"
    t.segments = [SegmentTrace("0718d8b9", 0, 16, "local")]
    t.first_token = 100.184
    t.completion_tokens = 48
    t.prompt_tokens = 22
    t.finished = 101.604
    t.outcome, t.finish_reason = "ok", "stop"
    return t


def test_summary_line_has_seed_fields_in_order():
    line = _finished_trace().summary_line()
    assert line.startswith("DIAG: request complete request_id=")
    order = ["route=local", "segments=1", "model=m-1234abcd", "nodes=0718d8b9", "queue_ms=3", "sched_ms=1",
             "ttft_ms=180", "decode_ms=1420", "total_ms=1604", "prompt_tokens=22", "tokens=48",
             "tok_per_sec=33.8", "tpot_ms=30.2", "outcome=ok"]
    positions = [line.index(f" {field}") for field in order]
    assert positions == sorted(positions)
    assert "assemblies=" not in line  # only when > 1
    assert "activation_bytes" not in line  # not measured on a local route


def test_absent_fields_are_omitted_never_zero():
    t = _trace()
    t.finished = 100.5
    t.outcome = "error"
    t.error_type = "ModelNotFound"
    line = t.summary_line()
    for field in ("route", "queue_ms", "sched_ms", "ttft_ms", "decode_ms", "tok_per_sec", "tpot_ms",
                  "prompt_tokens", "tokens"):
        assert f" {field}=" not in line
    headers = t.headers()
    assert headers["x-request-id"] == t.request_id
    assert not [h for h in headers if h.startswith("x-swarm-")]  # no route was assembled: nothing to claim
    assert headers["server-timing"] == "total;dur=500.0"
    assert "total_ms=500" in line and "outcome=error error_type=ModelNotFound" in line


def test_assemblies_and_segments_when_distributed():
    t = _finished_trace()
    t.assemblies = 2
    t.route = "distributed"
    t.segments = [SegmentTrace("aaaaaaaa", 0, 8, "direct", 520, 20000), SegmentTrace("bbbbbbbb", 8, 16, "relayed", 900, 19188)]
    line = t.summary_line()
    assert "assemblies=2" in line and "seg0_ms=520" in line and "seg1_ms=900" in line
    assert "activation_bytes=39188" in line and "nodes=aaaaaaaa,bbbbbbbb" in line
    headers = t.headers()
    assert headers["x-swarm-peers"] == "2" and headers["x-swarm-segments"] == "2"


def test_headers_stream_only_know_queue_and_sched():
    t = _finished_trace()
    full = t.headers()
    assert full["x-swarm-route"] == "local" and full["x-swarm-nodes"] == "0718d8b9"
    assert full["server-timing"].startswith("queue;dur=3.0, sched;dur=1.0, ttft;dur=180.0, decode;dur=1420.0")
    streaming = t.headers(streaming=True)
    assert "ttft" not in streaming["server-timing"] and "queue;dur=" in streaming["server-timing"]


def test_hub_rings_observers_and_in_flight(caplog):
    hub = TraceHub()
    events = []
    unsubscribe = hub.subscribe(lambda ev, tr: events.append((ev, tr.request_id)))
    ok, bad = hub.start(_trace()), hub.start(_trace())
    assert hub.in_flight == 2
    with caplog.at_level(logging.INFO):
        hub.finish(ok, "ok")
        hub.finish(bad, "error", error_type="EngineError", error_message="boom")
        hub.finish(bad, "error")  # closing twice is a no-op
    assert hub.in_flight == 0
    assert list(hub.recent) == [ok, bad] and list(hub.failures) == [bad]
    assert [e for e, _ in events] == ["started", "started", "finished", "finished"]
    assert caplog.text.count("DIAG: request complete") == 2
    unsubscribe()
    hub.start(_trace())
    assert len(events) == 4


def test_observer_failure_does_not_break_requests():
    hub = TraceHub()

    def broken(event, trace):
        raise RuntimeError("observer bug")

    hub.subscribe(broken)
    t = hub.start(_trace())
    hub.finish(t, "ok")
    assert hub.in_flight == 0


def test_the_public_error_hides_an_unresolved_model_name_and_keeps_the_rest():
    """A client error shows no message; the node's own message loses the client's model name
    (as a word: a name "a" must not eat the text; one before a period still goes)."""
    from node.errors import InvalidRequest

    t = RequestTrace(model="secret-name", operation="chat.completions")
    t.error_type, t.error_message, t.error_status = "EngineError", "no route for model secret-name.", 500
    assert t.public_error() == "EngineError: no route for model <unknown model>."
    short = RequestTrace(model="a", operation="chat.completions")
    short.error_type, short.error_message, short.error_status = "EngineError", "model a failed to say what", 500
    assert short.public_error() == "EngineError: model <unknown model> failed to say what"
    hub = TraceHub()
    client = hub.start(RequestTrace(model="x", operation="chat.completions"))
    hub.finish(client, "error", error=InvalidRequest("bad `top_p`: 7 (secret)", param="top_p"))
    assert client.public_error() == ("InvalidRequest (status=400, code=invalid_request, param=top_p; "
                                     "the message went to the client)")
