"""A slice's queue of received steps is bounded per sender (2026-12-07). Found in a security hunt: a
member could send WORK frames with payloads up to a frame's size faster than the slice computes
them, and every one was held in the slice's queue (memory without bound). Past
SLICE_QUEUE_SENDER_MAX_BYTES of one sender's steps queued, a further step is refused with
`overloaded` (back-pressure: its coordinator tries another holder or gives its client a 429); a
sender with nothing queued always gets a step in, and room comes back as the slice takes its steps."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from node import const
from node.inference.pipeline.wire import encode_tokens
from tests.pipeline.workerkit import COORD, _results, _work
from tests.support.waiting import wait_until


def _first(entry, sid: str):
    return dataclasses.replace(_work(entry, 0, 0, [5, 6, 7]), sid=sid)


async def test_one_senders_queued_steps_are_bounded_and_room_comes_back(worker, monkeypatch):
    w, entry, peers = worker
    hosted = w.host.find(entry.sha256, 0, entry.n_layers)
    step = encode_tokens([5, 6, 7])
    monkeypatch.setattr(const, "SLICE_QUEUE_SENDER_MAX_BYTES", 2 * len(step))  # two steps' payloads
    gate = threading.Event()
    blocker = asyncio.get_running_loop().run_in_executor(hosted.executor, lambda: gate.wait(30))
    try:
        for i in range(4):  # four sessions' first steps while the slice is busy: two fit
            w.on_work(_first(entry, f"s{i}").to_header(), step, COORD)
        refused = [r for r in _results(peers) if r.error_code == "overloaded"]
        assert [r.sid for r in refused] == ["s2", "s3"], _results(peers)
        assert "queued for layers 0-5" in refused[0].error
        assert hosted.step_queue.held == {COORD: 2 * len(step)}
    finally:
        gate.set()
    await blocker
    await wait_until(lambda: len(_results(peers)) == 4, 30, what="the two queued steps computed")
    assert all(r.error is None for r in _results(peers) if r.sid in ("s0", "s1"))
    assert hosted.step_queue.held == {}  # room again
    w.on_work(_first(entry, "s4").to_header(), step, COORD)
    await wait_until(lambda: len(_results(peers)) == 5, 30, what="a step taken again")
    assert _results(peers)[-1].error is None


async def test_a_step_larger_than_the_bound_is_taken_when_nothing_of_its_sender_waits(worker, monkeypatch):
    w, entry, peers = worker
    monkeypatch.setattr(const, "SLICE_QUEUE_SENDER_MAX_BYTES", 1)
    w.on_work(_work(entry, 0, 0, [5, 6, 7]).to_header(), encode_tokens([5, 6, 7]), COORD)
    await wait_until(lambda: len(_results(peers)) == 1, 30, what="its RESULT")
    assert _results(peers)[0].error is None
