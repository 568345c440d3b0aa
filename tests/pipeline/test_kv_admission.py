"""KV admission on a segment (kvbudget.py), in-process with workerkit.py's stand-ins: a step
that would open a session past what the sessions in use hold of the node's KV budget is refused
(`overloaded`), kept sessions give way to it, and the sessions in use are never evicted for it."""

from __future__ import annotations

import logging

import pytest

from node.inference.pipeline.kvbudget import reserve_bytes, reserve_positions
from node.inference.pipeline.wire import Hop, SessionControl, Work, encode_tokens
from node.inference.sampling import SamplingParams
from node.inference.slice.session import MIN_CAPACITY
from tests.pipeline.workerkit import COORD, ME, _results
from tests.support.waiting import wait_until


def _open(entry, sid: str, tokens: list[int], *, index_pos: int = 0, expect: int | None = None) -> Work:
    return Work(sid=sid, model=entry.sha256, seq=index_pos, index_pos=index_pos, n_tokens=len(tokens),
                route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=COORD, sample=True,
                sampling=SamplingParams(temperature=0.0), expect=expect)


async def _step(w, peers, work: Work, tokens: list[int]):
    n = len(_results(peers))
    w.on_work(work.to_header(), encode_tokens(tokens), COORD)
    await wait_until(lambda: len(_results(peers)) > n, 30, what=f"the RESULT of {work.sid}")
    return _results(peers)[-1]


async def test_a_session_past_what_sessions_in_use_hold_is_refused_and_they_go_on(worker, caplog):
    """Two sessions in use fill the budget: a third is refused with `overloaded` (the coordinator
    tries another holder, or answers 429), with a DIAG line; the two are not evicted, by the
    refusal nor by a sweep, and decode on from their KV."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    reserve = reserve_bytes(hosted.model, _open(entry, "x", [5, 6, 7]))
    w.host.kv_budget_bytes = int(2.5 * reserve)
    first = await _step(w, peers, _open(entry, "u1", [5, 6, 7]), [5, 6, 7])
    await _step(w, peers, _open(entry, "u2", [8, 9]), [8, 9])
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.kvbudget")
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.worker")
    refused = await _step(w, peers, _open(entry, "u3", [10, 11]), [10, 11])
    assert refused.error_code == "overloaded" and "KV cache budget" in refused.error, refused
    assert "u3" not in hosted.model.sessions
    assert any("DIAG: KV-cache session refused" in r.message and "session=u3" in r.message for r in caplog.records)
    # back-pressure, not a fault: no WARNING besides the refusal's own line (it was logged twice)
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert await w.host.async_sweep() == []
    decode = Work(sid="u1", model=entry.sha256, seq=1, index_pos=3, n_tokens=1, route=(Hop(ME, 0, entry.n_layers),),
                  hop=0, coordinator=COORD, sample=True)
    assert (await _step(w, peers, decode, [first.token])).error is None
    assert hosted.model.session("u1").kv_len == 4 and "u2" in hosted.model.sessions


async def test_kept_sessions_give_way_to_a_new_session_in_use(worker):
    """A session in use and two kept ones fill the budget: a new session is admitted (kept ones
    do not count) and the kept ones go for it at once, the one in use stays."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    reserve = reserve_bytes(hosted.model, _open(entry, "x", [5, 6, 7]))
    for sid in ("k1", "k2"):
        await _step(w, peers, _open(entry, sid, [5, 6, 7]), [5, 6, 7])
        w.on_session_end(SessionControl(sid, entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
    await _step(w, peers, _open(entry, "busy", [5, 6, 7]), [5, 6, 7])
    w.host.kv_budget_bytes = int(3.5 * reserve)  # k1, k2 and busy fit; one more does not, unless kept ones go
    assert w.host.kept_count() == 2
    assert (await _step(w, peers, _open(entry, "new", [8, 9]), [8, 9])).error is None
    await wait_until(lambda: w.host.kept_count() == 1, 10, what="the oldest kept session to give way")
    assert "k1" not in hosted.model.sessions and "busy" in hosted.model.sessions and "new" in hosted.model.sessions


async def test_a_session_is_admitted_for_its_whole_prefill(worker):
    """The opening step names the positions its attempt prefills (`expect`): a long prompt is
    refused at its first chunk, though that chunk alone would fit; with no session in use any
    session is admitted (waiting would not make room for it)."""
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    short = reserve_bytes(hosted.model, _open(entry, "x", [5, 6, 7]))
    w.host.kv_budget_bytes = int(2.5 * short)
    assert (await _step(w, peers, _open(entry, "big", [5] * 8, expect=400), [5] * 8)).error is None  # alone
    big = reserve_bytes(hosted.model, _open(entry, "big", [5] * 8, expect=400))
    assert big > 3 * short and hosted.model.sessions.bytes_by_kind()[0] == big  # 800 positions, not 256
    w.on_session_end(SessionControl("big", entry.sha256, "session_end").to_header(), b"", COORD)
    await wait_until(lambda: "big" not in hosted.model.sessions, 10, what="big freed")
    await _step(w, peers, _open(entry, "small", [5, 6, 7]), [5, 6, 7])
    refused = await _step(w, peers, _open(entry, "long", [5] * 8, expect=200), [5] * 8)
    assert refused.error_code == "overloaded"
    assert (await _step(w, peers, _open(entry, "chunk", [5] * 8), [5] * 8)).error is None  # (no expect: 256)


def test_the_reserve_is_twice_the_prefill_within_the_context():
    def work(index_pos, n, expect=None):
        return Work(sid="s", model="m", seq=0, index_pos=index_pos, n_tokens=n, route=(Hop(ME, 0, 6),), hop=0,
                    coordinator=COORD, sample=True, expect=expect)
    assert reserve_positions(work(0, 3), 1024) == MIN_CAPACITY
    assert reserve_positions(work(0, 200, expect=300), 1024) == 600
    assert reserve_positions(work(0, 200, expect=900), 1024) == 1024
    assert reserve_positions(work(150, 10), 1024) == 320  # a resume without expect: twice the step's end
    assert Work.from_header(work(0, 200, expect=300).to_header()).expect == 300
    from node.errors import ProtocolError
    with pytest.raises(ProtocolError, match="expect"):
        Work.from_header(work(0, 200, expect=100).to_header())


async def test_a_session_reserving_the_context_and_never_stepped_stops_holding_the_room(worker, monkeypatch):
    """A member that opens a session with `expect` at the whole context and never steps it again
    (or a coordinator gone mid-request) held the budget's room until the session TTL (5 min): every
    new session was refused. One idle for KV_RESERVE_IDLE_S counts what it holds (found in review)."""
    from node import const

    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    small = reserve_bytes(hosted.model, _open(entry, "x", [5]))
    w.host.kv_budget_bytes = 4 * small
    hog = await _step(w, peers, _open(entry, "hog", [5], expect=hosted.model.n_ctx), [5])
    assert hog.error is None and hosted.model.session("hog").reserved > w.host.kv_budget_bytes - small
    refused = await _step(w, peers, _open(entry, "honest", [6, 7]), [6, 7])
    assert refused.error_code == "overloaded", refused  # while the hog might be stepped, its reserve holds
    monkeypatch.setattr(const, "KV_RESERVE_IDLE_S", 0.05, raising=False)
    await wait_until(lambda: w.host.budget.committed() < w.host.kv_budget_bytes - small, 5, 0.02,
                     "the idle session's reserve to lapse")
    admitted = await _step(w, peers, _open(entry, "honest2", [6, 7]), [6, 7])
    assert admitted.error is None and "hog" in hosted.model.sessions  # not evicted: it counts its bytes
