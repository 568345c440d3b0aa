"""The coordinator's record of kept chain sessions: which one a prompt resumes, and why not."""

from __future__ import annotations

import logging
import time

from node import const
from node.inference.pipeline.prefix import ChainPrefixCache, KeptChain
from node.inference.pipeline.wire import Hop

ROUTE = (Hop("a" * 64, 0, 2), Hop("b" * 64, 2, 4))
OTHER = (Hop("a" * 64, 0, 2), Hop("c" * 64, 2, 4))
TURN1 = tuple(range(100, 160))  # the first turn's prompt + reply, as fed


def kept(sid: str, tokens=TURN1, route=ROUTE, model: str = "m", at: float | None = None) -> KeptChain:
    return KeptChain(sid, model, route, tuple(tokens), time.monotonic() if at is None else at)


def test_a_prompt_extending_a_kept_conversation_takes_it_once(caplog):
    cache = ChainPrefixCache(4)
    cache.put(kept("r1/1"))
    turn2 = [*TURN1[:-1], 999, 5, 6]  # the template's end-of-turn differs from the fed reply's last token
    with caplog.at_level(logging.DEBUG, logger="node.inference.pipeline.prefix"):
        entry, n, copy = cache.take("m", ROUTE, turn2, "r2")
        assert entry.sid == "r1/1" and n == len(TURN1) - 1 and not copy
        assert cache.take("m", ROUTE, turn2, "r3") == (None, 0, False)  # consumed: its KV is r2's now
    assert any("KV-cache HIT" in m and "cached_tokens=59" in m for m in caplog.messages)
    assert any("KV-cache MISS" in m and "reason=cache_empty" in m for m in caplog.messages)
    assert (cache.stats.hits, cache.stats.misses, cache.stats.cached_tokens) == (1, 1, 59)


def test_the_prompts_last_token_is_always_prefilled():
    cache = ChainPrefixCache(4)
    cache.put(kept("r1/1"))
    entry, n, _ = cache.take("m", ROUTE, list(TURN1), "r2")  # the same tokens again
    assert entry is not None and n == len(TURN1) - 1


def test_misses_say_why(caplog):
    cache = ChainPrefixCache(4)
    cache.put(kept("r1/1"))
    with caplog.at_level(logging.DEBUG, logger="node.inference.pipeline.prefix"):
        assert cache.take("m", OTHER, [*TURN1, 1], "r2") == (None, 0, False)  # another chain holds it
        assert cache.take("m", ROUTE, [*TURN1[:10], 1, 2, 3], "r3") == (None, 0, False)  # too short a prefix
        assert cache.take("m", ROUTE, [7, 8, 9] * 10, "r4") == (None, 0, False)
        assert cache.take("other-model", ROUTE, list(TURN1), "r5") == (None, 0, False)
    reasons = [m.split("reason=")[1].split()[0] for m in caplog.messages if "KV-cache MISS" in m]
    assert reasons == ["route_changed", "prefix_mismatch", "prefix_mismatch", "no_cached_prefix"]
    assert len(cache) == 1  # nothing taken
    short = ChainPrefixCache(4)
    short.put(kept("s/1", tokens=TURN1[:const.CHAIN_PREFIX_MIN_TOKENS - 1]))
    assert short.take("m", ROUTE, [*TURN1[:const.CHAIN_PREFIX_MIN_TOKENS - 1], 1, 2], "r6") == (None, 0, False)


def test_a_shared_system_prompt_is_copied_and_the_kept_conversation_stays(caplog):
    cache = ChainPrefixCache(4)
    cache.put(kept("r1/1", at=time.monotonic() - 100))
    cache.put(kept("later", tokens=[5] * 40))
    other = [*TURN1[:20], 1, 2, 3]  # another conversation: the first 20 tokens (a third) are shared
    with caplog.at_level(logging.DEBUG, logger="node.inference.pipeline.prefix"):
        entry, n, copy = cache.take("m", ROUTE, other, "r2")
    assert entry.sid == "r1/1" and n == 20 and copy
    assert list(cache.entries) == ["later", "r1/1"]  # still kept, now the most recently used
    assert time.monotonic() - cache.entries["r1/1"].kept_at < 5  # and its TTL starts again
    assert any("KV-cache HIT" in m and "copied_from=r1/1" in m and "cached_tokens=20" in m for m in caplog.messages)
    entry, n, copy = cache.take("m", ROUTE, [*TURN1, 7], "r3")  # its own next turn still resumes it
    assert entry.sid == "r1/1" and n == len(TURN1) and not copy
    assert (cache.stats.hits, cache.stats.copies, cache.stats.cached_tokens) == (2, 1, 20 + len(TURN1))
    assert cache.route_for("m", other) is None  # both consumed or not matching: no route preferred
    cache.put(kept("r4/1"))
    assert cache.route_for("m", other) == tuple((h.node_id, h.start, h.end) for h in ROUTE)


def test_a_copy_whose_kept_session_is_gone_forgets_it():
    cache = ChainPrefixCache(4)
    cache.put(kept("r1/1"))
    entry, n, copy = cache.take("m", ROUTE, [*TURN1[:20], 1], "r2")
    assert copy
    assert cache.missed_on_segment(n, entry.sid, source_gone=False) is None  # its own KV lost later
    assert len(cache) == 1 and cache.stats.copies == 0
    entry, n, copy = cache.take("m", ROUTE, [*TURN1[:20], 1], "r3")
    gone = cache.missed_on_segment(n, entry.sid)  # a segment refused the kept session
    assert gone is not None and gone.sid == "r1/1" and len(cache) == 0
    assert (cache.stats.hits, cache.stats.misses, cache.stats.gone_on_segment, cache.stats.copies) == (0, 2, 2, 0)


def test_lru_per_model_evicts_and_returns_what_to_free(caplog):
    cache = ChainPrefixCache(2)
    with caplog.at_level(logging.DEBUG, logger="node.inference.pipeline.prefix"):
        assert cache.put(kept("1", model="m")) == []
        assert cache.put(kept("x", model="n")) == []
        assert cache.put(kept("2", model="m")) == []
        evicted = cache.put(kept("3", model="m"))
    assert [e.sid for e in evicted] == ["1"] and sorted(cache.entries) == ["2", "3", "x"]
    evicted = [r for r in caplog.records if "KV-cache sequence evicted" in r.getMessage()]
    assert len(evicted) == 1 and "kept=1" in evicted[0].getMessage()
    assert evicted[0].levelno == logging.DEBUG  # per request once full: not an INFO line each (2026-12-07)
    assert cache.stats.evictions == 1


def test_expired_and_lost_chains_are_forgotten():
    cache = ChainPrefixCache(4)
    cache.put(kept("old", at=time.monotonic() - const.KEPT_SESSION_TTL_S - 1))
    cache.put(kept("via-c", route=OTHER))
    assert [e.sid for e in cache.through("c" * 64)] == ["via-c"]
    assert cache.take("m", ROUTE, [*TURN1, 1], "r") == (None, 0, False)  # "old" is past the kept TTL
    assert len(cache) == 0


def test_off_when_no_sequences_are_kept():
    cache = ChainPrefixCache(0)
    cache.put(kept("1"))
    assert cache.take("m", ROUTE, [*TURN1, 1], "r") == (None, 0, False)


def test_the_route_a_prompt_would_resume_is_offered_to_the_planner():
    cache = ChainPrefixCache(4)
    assert cache.route_for("m", list(TURN1)) is None
    cache.put(kept("r1/1", route=OTHER))
    turn2 = [*TURN1, 7, 8]
    assert cache.route_for("m", turn2) == (("a" * 64, 0, 2), ("c" * 64, 2, 4))
    assert cache.route_for("other-model", turn2) is None
    assert cache.route_for("m", list(range(500, 560))) is None  # shares nothing
    assert cache.route_for("m", [*TURN1[:10], 1, 2, 3]) is None  # shorter than CHAIN_PREFIX_MIN_TOKENS
    # offering it takes nothing: the hit is still there for the attempt on that route
    entry, n, _ = cache.take("m", OTHER, turn2, "r2")
    assert entry is not None and n == len(TURN1)
    assert ChainPrefixCache(0).route_for("m", turn2) is None  # off
