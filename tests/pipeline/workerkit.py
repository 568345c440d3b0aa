"""The segment worker in-process, shared by its test modules: the real PipelineTransport with no
peer network (frames addressed to this node are delivered locally; frames to other nodes are
captured by a recording peers stand-in) and WORK makers. The `worker` fixture (a worker serving a
whole 6-layer model) is in conftest.py."""

from __future__ import annotations

import contextlib
import time

from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.wire import Hop, Result, Work
from node.inference.pipeline.worker import SegmentWorker
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from node.net import FrameType
from tests.pipeline.swarm import split_model

ME, COORD, NEXT = "a" * 64, "c" * 64, "b" * 64


class RecordingLink:
    def __init__(self, peers):
        self.peers = peers
        self.unsent = peers.unsent  # bytes "still queued" on the link

    def send_nowait(self, frame):
        self.peers.sent.append(frame)
        self.peers.writes.append([frame.type])

    def send_many_nowait(self, frames):
        self.peers.sent.extend(frames)
        self.peers.writes.append([f.type for f in frames])


class RecordingPeers:
    """Stands in for PeerManager: every remote node has a link that records frames (and which
    frames went out in one write)."""

    def __init__(self, unsent: int = 0):
        self.sent = []
        self.writes = []
        self.unsent = unsent

    def link(self, node_id):
        return RecordingLink(self)

    def peer(self, node_id):
        return None


def _work(entry, seq, index_pos, tokens, **kw):
    return Work(sid="s1", model=entry.sha256, seq=seq, index_pos=index_pos, n_tokens=len(tokens),
                route=(Hop(ME, 0, entry.n_layers),), hop=0, coordinator=COORD, sample=True,
                sampling=SamplingParams(temperature=0.0), **kw)


def _results(peers):
    return [Result.from_header(f.header) for f in peers.sent if f.type == FrameType.RESULT]


@contextlib.asynccontextmanager
async def first_slice(tmp_path, transport):
    """A worker serving layers 0-2 of the 6-layer model: the first of two segments."""
    entry = ModelCatalog(None).scan([(split_model(tmp_path), "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)
    await host.async_load(entry, 0, 3)
    try:
        yield SegmentWorker(ME, host, transport), entry
    finally:
        await host.async_close()


def _first_of_two(entry, tokens, coordinator=COORD, **kw):
    """Step 0 of a session routed ME (layers 0-2) → NEXT (layers 3-5)."""
    return Work(sid="s", model=entry.sha256, seq=0, index_pos=0, n_tokens=len(tokens),
                route=(Hop(ME, 0, 3), Hop(NEXT, 3, 6)), hop=0, coordinator=coordinator, sample=True,
                sampling=SamplingParams(), **kw)


def gate_wait(gate) -> None:
    deadline = time.monotonic() + 10
    while not gate.done() and time.monotonic() < deadline:
        time.sleep(0.001)


def _frames(peers):
    return [(f.type, f.header) for f in peers.sent]
