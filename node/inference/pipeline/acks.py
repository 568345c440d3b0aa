"""A segment's ACKs: each WORK is acknowledged to its coordinator once, with the step's output
(marked `done`) or ACK_HOLD_S after receipt when the step takes longer (SegmentWorker.on_work says
why it is held). Loop thread only."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from node.errors import PeerUnreachable
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import Ack, Work
from node.logs import MESSAGE, kv
from node.net import FrameType

log = logging.getLogger(__name__)


class PendingAck:
    """An ACK not sent yet."""

    __slots__ = ("work", "received", "timer", "sent")

    def __init__(self, work: Work, received: float):
        self.work, self.received = work, received
        self.timer: asyncio.TimerHandle | None = None
        self.sent = False


class Acks:
    """Sends (or hands out the header of) each WORK's single ACK."""

    def __init__(self, node_id: str, transport: PipelineTransport):
        self.node_id = node_id
        self.transport = transport

    def send(self, ack: PendingAck | None, done: bool = False) -> None:
        """Tell the coordinator a WORK arrived (once); `done`: its output has just left."""
        header = self.take(ack, done)
        if header is None:
            return
        try:
            self.transport.send(ack.work.coordinator, FrameType.ACK, header)
        except PeerUnreachable:
            log.info("DIAG: ACK not sent, no link to coordinator %s",
                     kv(coordinator=ack.work.coordinator[:8], sid=ack.work.sid))

    def take(self, ack: PendingAck | None, done: bool = False) -> dict[str, Any] | None:
        """The ACK's header if it is still to be sent (the caller sends it), else None. A node that
        is its own coordinator hears only of a finished step (no socket: a local call)."""
        if ack is None or ack.sent:
            return None
        ack.sent = True
        if ack.timer is not None:
            ack.timer.cancel()
        work = ack.work
        if work.coordinator == self.node_id and not done:
            return None
        held_us = int((time.monotonic() - ack.received) * 1e6)
        if log.isEnabledFor(MESSAGE):  # seed 000 marker
            log.log(MESSAGE, "DIAG: acknowledged tensor forward on receipt %s",
                      kv(sid=work.sid, seq=work.seq, hop=work.hop, held_us=held_us))
        return Ack(work.sid, work.seq, work.hop, self.node_id, held_us, done).to_header()
