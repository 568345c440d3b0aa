"""Remote generate, pure parts: GENERATE/TOKENS/GENERATE_CANCEL on the wire, whole holders in the
planner and in LayerHolders, the coordinator's TOKENS stream (order, keepalive, silence)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from node.errors import ProtocolError, SegmentFailed
from node.inference.pipeline.holders import LayerHolders
from node.inference.pipeline.perf import PeerPerformance
from node.inference.pipeline.planner import Holder, plan_route
from node.inference.pipeline.remote_stream import RemoteStream
from node.inference.pipeline.remote_wire import MAX_PROMPT_TOKENS, Generate, GenerateCancel, Tokens, sid_of
from node.inference.pipeline.wire import encode_tokens
from node.inference.sampling import SamplingParams

SHA, COORD = "5" * 64, "c" * 64
A, B, C = "a" * 64, "b" * 64, "d" * 64


def _gen(**over) -> tuple[dict, bytes]:
    g = Generate("req/1", SHA, (1, 2, 3), SamplingParams(temperature=0.0, top_k=1), 16, COORD)
    header = g.to_header()
    header.update(over)
    return header, g.payload()


def test_generate_round_trip():
    header, payload = _gen()
    g = Generate.from_frame(header, payload)
    assert (g.sid, g.model, g.tokens(), g.max_new_tokens, g.coordinator) == ("req/1", SHA, [1, 2, 3], 16, COORD)
    assert g.sampling.temperature == 0.0 and g.sampling.top_k == 1
    assert Generate.from_frame(header, payload, n_vocab=4).tokens() == [1, 2, 3]
    assert g.to_header() == header and g.payload() == payload


def test_a_failover_generate_says_how_much_of_the_prompt_is_the_reply_so_far():
    """The holder replays those tokens through an output grammar instead of starting it over."""
    header, payload = _gen()
    assert "gen" not in header and Generate.from_frame(header, payload).generated() == ()
    g = Generate("req/2", SHA, (1, 2, 3, 4, 5), SamplingParams(), 16, COORD, n_generated=2)
    back = Generate.from_frame(g.to_header(), g.payload())
    assert back.n_generated == 2 and back.generated() == (4, 5)
    for bad in (5, -1, True, "2"):  # the prompt must keep at least one token of its own
        with pytest.raises(ProtocolError, match="generated token count"):
            Generate.from_frame({**g.to_header(), "gen": bad}, g.payload())


def test_a_decoded_prompt_stays_an_array_over_the_payload():
    """No Python int per token at decode time: the prompt is a read-only view of the payload, its ids
    checked vectorised (or left to the holder, which first checks the length against its context)."""
    header, payload = _gen()
    g = Generate.from_frame(header, payload)
    assert isinstance(g.prompt, np.ndarray) and g.prompt.dtype == np.dtype("<i4") and not g.prompt.flags.writeable
    assert np.shares_memory(g.prompt, np.frombuffer(payload, dtype="<i4"))
    assert all(type(t) is int for t in g.tokens())
    bad = encode_tokens([3, 9, -1, 12])
    unchecked = Generate.from_frame({**header, "n": 4}, bad, check_ids=False)
    assert unchecked.outside_vocabulary(None) == -1 and unchecked.outside_vocabulary(10) == -1
    assert Generate.from_frame(header, payload, check_ids=False).outside_vocabulary(3) == 3
    assert Generate.from_frame(header, payload).outside_vocabulary(4) is None


def test_the_prompt_length_is_bounded_and_checked_against_the_payload_first():
    header, _ = _gen()
    assert MAX_PROMPT_TOKENS * 4 <= 256 * 1024 * 1024  # one frame
    with pytest.raises(ProtocolError, match="prompt length"):
        Generate.from_frame({**header, "n": MAX_PROMPT_TOKENS + 1}, b"")
    with pytest.raises(ProtocolError, match=f"says {MAX_PROMPT_TOKENS} tokens but carries 12 bytes"):
        Generate.from_frame({**header, "n": MAX_PROMPT_TOKENS}, encode_tokens([1, 2, 3]))


@pytest.mark.parametrize(("over", "payload", "words"), [
    ({"sid": ""}, None, "session id"),
    ({"sid": 7}, None, "session id"),
    ({"model": "not-a-sha"}, None, "model sha256"),
    ({"coord": "x" * 64}, None, "coordinator"),
    ({"n": 4}, None, "says 4 tokens but carries 12 bytes"),
    ({"n": True}, None, "prompt length"),
    ({"n": 0}, b"", "prompt length"),
    ({"max_new": 0}, None, "max new tokens"),
    ({"max_new": "16"}, None, "max new tokens"),
    ({"sampling": None}, None, "no sampling"),
    ({"sampling": {"temperature": "hot"}}, None, "sampling"),
    ({}, b"\x01\x02\x03", "carries 3 bytes"),
    ({"n": 1}, encode_tokens([-5]), "outside the vocabulary"),
])
def test_generate_refuses_bad_fields(over, payload, words):
    header, good = _gen(**over)
    with pytest.raises(ProtocolError, match=words):
        Generate.from_frame(header, good if payload is None else payload)


def test_generate_checks_the_vocabulary_when_given():
    header, payload = _gen()
    with pytest.raises(ProtocolError, match="outside the vocabulary"):
        Generate.from_frame(header, payload, n_vocab=3)
    with pytest.raises(ProtocolError, match="not an object"):
        Generate.from_frame([1], payload)


def test_tokens_round_trip_keepalive_end_and_error():
    t = Tokens("s", 4, (9, 8), eval_us=1500)
    assert Tokens.from_frame(t.to_header(), t.payload()) == t
    keep = Tokens("s", 6)
    assert keep.payload() == b"" and Tokens.from_frame(keep.to_header(), b"") == keep
    end = Tokens("s", 6, end="eog")
    assert Tokens.from_frame(end.to_header(), b"").end == "eog"
    err = Tokens("s", 0, end="error", error_code="model_not_held_whole", error="no")
    back = Tokens.from_frame(err.to_header(), b"")
    assert (back.end, back.error_code, back.error) == ("error", "model_not_held_whole", "no")


@pytest.mark.parametrize(("header", "payload", "words"), [
    ({"sid": "s", "first": -1, "n": 0}, b"", "first token index"),
    ({"sid": "s", "first": 0, "n": 2}, encode_tokens([1]), "says 2 tokens"),
    ({"sid": "s", "first": 0, "n": 1}, encode_tokens([-1]), "negative"),
    ({"sid": "s", "first": 0, "n": 0, "end": "later"}, b"", "bad TOKENS end"),
    ({"sid": "s", "first": 0, "n": 0, "end": "error"}, b"", "no code"),
    ({"sid": "s", "first": 0, "n": 0, "error": "x"}, b"", "not an object"),
    ({"sid": "s", "first": 0, "n": 0, "error": {"code": 3}}, b"", "strings"),
    ({"first": 0, "n": 0}, b"", "session id"),
])
def test_tokens_refuses_bad_fields(header, payload, words):
    with pytest.raises(ProtocolError, match=words):
        Tokens.from_frame(header, payload)


def test_cancel_and_sid_of():
    assert GenerateCancel.from_header(GenerateCancel("s/2").to_header()).sid == "s/2"
    with pytest.raises(ProtocolError):
        GenerateCancel.from_header({"sid": None})
    assert sid_of({"sid": "ok"}) == "ok" and sid_of({"sid": ""}) is None and sid_of("x") is None


# --- the planner and the holders ---------------------------------------------------------------


def test_a_whole_holder_is_one_segment_weighed_by_its_time_per_token():
    whole = Holder(A, 0, 8, "direct", 1.0, 0.5, whole=True)  # 4 ms/token
    halves = [Holder(B, 0, 4, "direct", 1.0, 1.0), Holder(C, 4, 8, "direct", 1.0, 1.0)]  # 8 ms + hops
    plan = plan_route(8, [whole, *halves])
    assert [h.node_id for h in plan.segments] == [A] and plan.segments[0].whole
    assert plan.est_ms == pytest.approx(4.0 + 0.5 + 0.5)
    slow = Holder(A, 0, 8, "direct", 1.0, 5.0, whole=True)
    assert [h.node_id for h in plan_route(8, [slow, *halves]).segments] == [B, C]
    # excluded (failed): the slices take over
    assert [h.node_id for h in plan_route(8, [whole, *halves], exclude=frozenset({A})).segments] == [B, C]


def test_a_whole_holder_is_never_cut_and_a_second_one_is_its_standby():
    # a whole advert whose range is not the model's (a bad or stale advert) is not usable at all
    assert plan_route(8, [Holder(A, 0, 8, whole=True), Holder(B, 0, 8, whole=True)]).standbys[0][0].node_id == B
    with pytest.raises(Exception, match="no chain"):
        plan_route(8, [Holder(A, 0, 4, whole=True), Holder(B, 4, 8)])


class _Peers:
    def __init__(self, snaps):
        self.snaps = snaps

    def peers(self):
        return self.snaps


def _snap(node_id, models, state="connected"):
    return SimpleNamespace(node_id=node_id, state=state, models=models, transport="direct", rtt_ms=2.0, region=None)


def test_layer_holders_read_whole_adverts():
    host = SimpleNamespace(for_model=lambda sha: [], adverts=lambda: [])
    perf = PeerPerformance(COORD)
    peers = _Peers([
        _snap(A, [{"sha256": SHA, "name": "m", "n_layers": 6, "whole": True, "ms_per_token": 12.0}]),
        _snap(B, [{"sha256": SHA, "name": "m", "n_layers": 6, "whole": True}]),
        _snap(C, [{"sha256": SHA, "name": "m", "n_layers": 6, "whole": True, "paused": True}]),
        _snap("e" * 64, [{"sha256": SHA, "n_layers": "six", "whole": True}]),  # malformed: skipped
        _snap("f" * 64, [{"sha256": SHA, "n_layers": 6, "whole": True}], state="connecting"),
    ])
    holders = LayerHolders(COORD, host, peers, None, perf)
    got = {h.node_id: h for h in holders.holders(SHA)}
    assert set(got) == {A, B}
    assert got[A].whole and (got[A].start, got[A].end) == (0, 6) and got[A].ms_per_layer == pytest.approx(2.0)
    assert got[B].ms_per_layer == pytest.approx(2.0)  # unmeasured: as fast as the measured ones' median
    perf.observe_whole(B, 6, 3000, 1, 3.5)  # measured: 3 ms per token
    assert {h.node_id: h for h in holders.holders(SHA)}[B].ms_per_layer == pytest.approx(0.5)
    assert holders.swarm_models() == {SHA: {"name": "m", "n_layers": 6}}


# --- the coordinator's stream ------------------------------------------------------------------


async def test_stream_delivers_in_order_skips_keepalives_and_ends():
    s = RemoteStream("s", A, 5.0)
    s.feed(Tokens("s", 0, (1, 2)))
    s.feed(Tokens("s", 2))  # keepalive
    s.feed(Tokens("s", 2, (3,)))
    s.feed(Tokens("s", 3, end="eog"))
    got = [await s.next() for _ in range(3)]
    assert [m.tokens for m in got] == [(1, 2), (3,), ()] and got[-1].end == "eog" and s.ended
    s.close()


async def test_stream_fails_on_a_gap_or_a_repeat():
    s = RemoteStream("s", A, 5.0)
    s.feed(Tokens("s", 0, (1, 2)))
    s.feed(Tokens("s", 1, (2, 3)))  # repeats token 1
    assert (await s.next()).tokens == (1, 2)  # what came before the failure is still delivered
    with pytest.raises(SegmentFailed) as failed:
        await s.next()
    assert failed.value.cause == "protocol" and failed.value.node_id == A
    s.close()


async def test_stream_fails_when_the_holder_is_silent_and_keepalives_hold_it_off():
    silenced = []
    s = RemoteStream("s", A, 0.3, lambda: silenced.append(1))
    for _ in range(4):  # keepalives every 0.15 s keep a slow holder alive past the budget
        await asyncio.sleep(0.15)
        s.feed(Tokens("s", 0))
    assert s.failure is None
    with pytest.raises(SegmentFailed) as failed:
        await asyncio.wait_for(s.next(), 5)
    assert failed.value.cause == "tokens_deadline" and silenced == [1]
    s.close()
