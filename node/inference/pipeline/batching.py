"""How a segment groups the WORK steps queued for one slice into batches (one forward for several
sessions: `SliceModel.forward_many`). The worker (worker.py) queues, drains and runs them."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node import const
from node.inference.pipeline.wire import Work

if TYPE_CHECKING:
    import torch


class StepQueue:
    """WORK steps received for a slice, waiting for its executor (the worker runs them in batches)."""

    def __init__(self) -> None:
        self.items: deque = deque()
        self.lock = threading.Lock()
        self.scheduled = False  # a drain task is submitted to the executor or running
        self.held: dict[str, int] = {}  # payload bytes queued, by sender (const.SLICE_QUEUE_SENDER_MAX_BYTES)

    def room_for(self, sender: str, n_bytes: int) -> bool:
        """Whether `sender` may queue a step of `n_bytes` more (under `lock`)."""
        held = self.held.get(sender, 0)
        return held == 0 or held + n_bytes <= const.SLICE_QUEUE_SENDER_MAX_BYTES

    def add(self, job: StepJob) -> None:
        """Queue `job` (under `lock`)."""
        self.items.append(job)
        self.held[job.sender] = self.held.get(job.sender, 0) + len(job.payload)

    def taken(self, jobs: list[StepJob]) -> None:
        """`jobs` left the queue (under `lock`)."""
        for job in jobs:
            left = self.held.get(job.sender, 0) - len(job.payload)
            if left > 0:
                self.held[job.sender] = left
            else:
                self.held.pop(job.sender, None)


class StepJob:
    """A received WORK waiting for (or in) a batch on its slice's executor."""

    __slots__ = ("work", "payload", "received", "sender", "ack", "started", "prepared", "handed_back")

    def __init__(self, work: Work, payload: bytes, received: float, sender: str, ack: Any):
        self.work, self.payload, self.received, self.sender, self.ack = work, payload, received, sender, ack
        self.started = self.prepared = received
        self.handed_back = False


@dataclass
class PreparedStep:
    sess: Any  # its Session on the slice
    inputs: torch.Tensor
    is_last: bool
    verify: bool  # a draft to verify: every row's logits
    last_only: bool


def take_batch(items: deque[StepJob], max_rows: int = const.BATCH_MAX_ROWS) -> list[StepJob]:
    """The queued steps to run as one forward, taken out of `items` (the rest keep their order):
    in arrival order, one step per session (a session's next step waits for this one), all over
    the first one's layer range, at most BATCH_MAX_STEPS steps and `max_rows` rows (a longer
    first step runs alone)."""
    taken: list[StepJob] = []
    left: list[StepJob] = []
    sids: set[str] = set()  # taken, or with an earlier step left queued
    rows = 0
    layers = None
    while items:
        job = items.popleft()
        w = job.work
        key = (w.target.start, w.target.end)
        if w.sid in sids or (taken and (key != layers or len(taken) >= const.BATCH_MAX_STEPS
                                        or rows + w.n_tokens > max_rows)):
            left.append(job)
        else:
            taken.append(job)
            rows += w.n_tokens
            layers = key
        sids.add(w.sid)
    items.extend(left)
    return taken
