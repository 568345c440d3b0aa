"""This node's own pause (its loop blocked, as under SIGSTOP) driven on the real pipeline machinery:
a real PipelineCoordinator, PipelineRun, StepDeadlines, PipelineTransport and LoopWatchdog, with a
stand-in peer table whose one peer holds the whole model as a slice, answers each WORK with a
RESULT on a later loop pass, holds the RESULT after HELD_AFTER steps until the test lets it go, and
can show a link's close window (the table says connected, link() is None).

    peers = Peers()
    with watched_loop() as dog, coordinating(peers, pauses=dog) as coordinator:
        run, trace, consuming, got = await streaming(coordinator, "req-1")
        held = await pause_with_a_result_held(peers)
        peers.deliver(held)
        await asyncio.wait_for(consuming, 30)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

from node import const
from node.inference.handoff import GenerationJob
from node.inference.pipeline.coordinator import PipelineCoordinator
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import Result, Work
from node.inference.sampling import SamplingParams
from node.net import FrameType, PeerSnapshot
from node.trace import RequestTrace
from node.watchdog import LoopWatchdog
from tests.support.waiting import wait_until

ME, PEER, SHA = "a" * 64, "b" * 64, "f" * 64
MAX_NEW = 12
HELD_AFTER = 4  # the peer answers this many steps, then holds the next RESULT until the test lets it go


def pause_this_node(seconds: float) -> None:
    time.sleep(seconds)  # deliberately blocking: the loop does not run, as under SIGSTOP


@contextlib.contextmanager
def watched_loop() -> Iterator[LoopWatchdog]:
    """A started LoopWatchdog on the running loop (it records this node's pauses), stopped after."""
    dog = LoopWatchdog()
    dog.start()
    try:
        yield dog
    finally:
        dog.stop()


class Host:
    """This node holds no layers of its own."""

    def for_model(self, sha256):
        return []

    def adverts(self):
        return []


class Link:
    """The peer's end: answers each WORK with a RESULT on a later loop pass (or holds it)."""

    def __init__(self, peers: Peers):
        self.peers, self.last_seen, self.unsent = peers, time.monotonic(), 0

    def send_nowait(self, frame) -> None:
        if frame.type != FrameType.WORK:
            return
        work = Work.from_header(frame.header)
        result = Result(work.sid, work.seq, token=100 + work.index_pos).to_header()
        self.peers.works += 1
        answer = self.peers.answer(work) if self.peers.answer is not None else None
        if answer is not None:
            asyncio.get_running_loop().call_soon(self.peers.deliver, answer)
        elif self.peers.works == HELD_AFTER + 1:
            self.peers.held = result
        else:
            asyncio.get_running_loop().call_soon(self.peers.deliver, result)


class Peers:
    """Stand-in PeerManager: one peer holding the whole model as a slice."""

    def __init__(self):
        self.snap = PeerSnapshot(PEER, PEER[:8], "connected", "direct", "127.0.0.1:1", 2.0, 200.0,
                                 ({"sha256": SHA, "name": "m", "start": 0, "end": 8, "n_layers": 8,
                                   "ms_per_layer": 1.0},), time.time(), connections=1)
        self.connection = 1
        self.live: Link | None = Link(self)
        self.works = 0
        self.held: dict | None = None
        self.observers: list = []
        self.coordinator: PipelineCoordinator | None = None
        self.broken = False  # set from the test's safety-valve thread: the run must stop somehow
        self.answer = None  # a test's own answer to a WORK (a RESULT header), None: the usual one

    def deliver(self, header: dict) -> None:
        self.coordinator.on_result(header, b"", PEER)

    def _check(self) -> None:
        if self.broken:
            raise RuntimeError("the test gave up on a request that never yielded the loop")

    def peers(self):
        self._check()
        return [dataclasses.replace(self.snap, connection_id=self.connection)] if self.snap else []

    def peer(self, node_id):
        self._check()
        return dataclasses.replace(self.snap, connection_id=self.connection) if node_id == PEER and self.snap else None

    def link(self, node_id):
        self._check()
        return self.live if node_id == PEER else None

    def rto(self, node_id):
        return None

    def subscribe(self, callback):
        self.observers.append(callback)
        return lambda: self.observers.remove(callback)

    def register_handler(self, frame_type, handler) -> None:
        pass

    def relink(self, state: str, connection: int | None = None) -> None:
        """The peer table changes: the link closed ("disconnected"), or a new one came up."""
        if connection is not None:
            self.connection, self.live = connection, Link(self)
        elif state != "connected":
            self.live = None
        self.snap = dataclasses.replace(self.snap, state=state)
        for observer in list(self.observers):
            observer("changed", self.snap)


def next_hop_unreachable(header: dict, node_id: str = PEER) -> dict:
    """The RESULT of a hop that could not forward the step (header: the held RESULT's, or the WORK's
    sid and seq) to `node_id`."""
    return Result(header["sid"], header["seq"], error=f"no link to peer {node_id[:8]}",
                  error_code="next_hop_unreachable", failed_node=node_id).to_header()


@contextlib.contextmanager
def coordinating(peers: Peers, pauses: LoopWatchdog | None = None, host: Any = None,
                 transport: PipelineTransport | None = None) -> Iterator[PipelineCoordinator]:
    """A real coordinator on the stand-in peer table (the peers' RESULTs go to it), closed after."""
    coordinator = PipelineCoordinator(ME, transport or PipelineTransport(ME, peers), peers,
                                      Host() if host is None else host, pauses=pauses)
    peers.coordinator = coordinator
    coordinator.register()
    try:
        yield coordinator
    finally:
        coordinator.close()


def request(job_id: str, max_new: int = MAX_NEW) -> tuple[GenerationJob, RequestTrace]:
    """A greedy request for the stand-in model and its trace."""
    job = GenerationJob(job_id, [1, 2, 3], SamplingParams(temperature=0), max_new)
    return job, RequestTrace(model="m", operation="chat.completions")


def begin(coordinator: PipelineCoordinator, job: GenerationJob, trace: RequestTrace):
    """coordinator.begin for the stand-in model (a coroutine: await it, or make it a task)."""
    return coordinator.begin(job, SimpleNamespace(sha256=SHA, n_layers=8), trace, lambda t: False)


class Stream(NamedTuple):
    run: Any  # the PipelineRun
    trace: RequestTrace
    consuming: asyncio.Task  # reads the run's tokens into `got` until it ends (or raises as it did)
    got: list[int]


async def streaming(coordinator: PipelineCoordinator, job_id: str) -> Stream:
    """A request under way on the coordinator, its tokens being read."""
    job, trace = request(job_id)
    run = await begin(coordinator, job, trace)
    got: list[int] = []

    async def consume():
        async for batch in run.tokens():
            got.extend(batch)

    return Stream(run, trace, asyncio.create_task(consume()), got)


async def pause_with_a_result_held(holder: Any, what: str = "the peer to hold a RESULT") -> dict:
    """Wait until `holder` (the stand-in peers, or a local segment's stand-in) holds a step's
    RESULT, then pause this node past SELF_PAUSE_MIN_S; returns the held RESULT's header."""
    await wait_until(lambda: holder.held is not None, 10, 0.01, what)
    pause_this_node(const.SELF_PAUSE_MIN_S + 0.3)
    return holder.held
