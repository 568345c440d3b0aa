"""The segment side's session control (a mixin of worker.SegmentWorker): CANCEL and SESSION_END
from the coordinator that opened a session — free it, or keep it for that coordinator's next turn
(prefix reuse) — the tombstones that stop a late WORK of an ended attempt from opening it again,
and the sweep of samplers and tombstones."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from node import const
from node.errors import ProtocolError
from node.inference.pipeline.wire import SessionControl
from node.logs import kv

if TYPE_CHECKING:
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.hosted import HostedSlice
    from node.inference.pipeline.sampler import Sampler

log = logging.getLogger("node.inference.pipeline.worker")  # the worker's lines, as before the split


class SessionControls:
    """CANCEL / SESSION_END handling for SegmentWorker (which provides these attributes)."""

    node_id: str
    host: SliceHost
    samplers: dict[str, Sampler]
    ended: dict[tuple[str, str], float]
    contributing: Any
    control_budget: ControlBudget

    def on_cancel(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        self._end_session(header, "cancelled", sender)

    def on_session_end(self, header: dict[str, Any], payload: bytes, sender: str) -> None:
        self._end_session(header, "session_end", sender)

    def _end_session(self, header: dict[str, Any], why: str, sender: str) -> None:
        try:
            ctl = SessionControl.from_header(header)
        except ProtocolError as exc:
            log.warning("DIAG: malformed session control dropped %s", kv(error=exc.message))
            return
        hosted_slices = self.host.for_model(ctl.model, draining=True)
        if not hosted_slices:  # nothing here to end or tombstone: it costs nothing, nor is it charged
            return             # (a consumer-only node kept a bucket for every sender, for ever)
        # every slice, not only the named model's: the sender names the model
        held = [s for h in self.host.slices.values() if h.model is not None
                for s in [h.model.sessions.peek(ctl.sid)] if s is not None]
        owners = {s.coordinator for s in held if s.coordinator is not None}
        if owners - {sender}:  # only the coordinator that opened a session ends it
            # charged too: a segment on another coordinator's route sees its sids in the WORK it
            # forwards, and 5,000 CANCELs naming them logged 5,000 WARNINGs, none dropped
            if self.control_budget.take(sender) and self.control_budget.first(sender, "not_coordinator"):
                log.warning("DIAG: session control from a node that is not the session's coordinator dropped %s",
                            kv(sender=sender[:8], sid=ctl.sid, why=why, more="not logged until its budget refills"))
            return
        # ending what its sender has in use here is free; anything else costs a tombstone and
        # executor jobs, and a member sending them back to back (a work frame: no link budget)
        # grew the tombstones without bound and queued jobs before the slices' steps
        if not any(s.kept_for is None for s in held) and not self.control_budget.take(sender):
            return
        # also when kept: a late WORK of the ended attempt must not write into what is kept
        self.ended[(ctl.sid, sender)] = time.monotonic() + const.SESSION_TOMBSTONE_S
        # keep: only for the coordinator that started the session, into a slice that still serves,
        # and not for other nodes while this one has paused contributing
        keep = ctl.keep and bool(sender) and (sender == self.node_id or self.contributing())
        kept = False
        for hosted in hosted_slices:
            if keep and hosted.state == "loaded" and self._keep(hosted, ctl.sid, sender):
                kept = True
            else:
                hosted.executor.submit(self._free, hosted, ctl.sid, why)
        if kept:
            self.host.request_sweep()  # the KV budget holds with what is kept

    def _is_ended(self, sid: str, coordinator: str) -> bool:
        """Whether `coordinator` ended the session `sid` (a tombstone another node set does not count)."""
        expiry = self.ended.get((sid, coordinator))
        return expiry is not None and expiry > time.monotonic()

    def _drop_ended(self, hosted: HostedSlice, sid: str) -> None:
        """A step of an ended session finished computing after the CANCEL / SESSION_END: free what it
        made, unless the SESSION_END kept the session (the step was sent before the attempt ended:
        the next step before the stream when a stop sequence matched) — its next turn resumes it."""
        hosted.executor.submit(self._free, hosted, sid, "ended", True)

    def _keep(self, hosted: HostedSlice, sid: str, coordinator: str) -> bool:
        """Loop thread: a finished session stays for its coordinator's next turn (marked at once,
        so that turn's resume, even queued in the same batch, finds it kept); False if this slice
        does not hold it for that coordinator. Its sampler goes on the executor (its thread)."""
        sess = hosted.model.sessions.keep(sid, coordinator) if hosted.model is not None else None
        if sess is None:
            return False
        log.debug("DIAG: KV session kept for prefix reuse %s", kv(
            sid=sid, kv_len=sess.kv_len, bytes=sess.nbytes, layers=f"{hosted.start}-{hosted.end - 1}"))
        hosted.executor.submit(self.samplers.pop, sid, None)
        return True

    def _free(self, hosted: HostedSlice, sid: str, why: str, unless_kept: bool = False) -> None:
        if hosted.model.free_session(sid, unless_kept):
            # DEBUG: one per slice per request (each cancelled one), on every node of the route
            log.debug("DIAG: KV session freed %s", kv(sid=sid, reason=why, layers=f"{hosted.start}-{hosted.end - 1}"))
        self.samplers.pop(sid, None)

    def forget_expired(self) -> None:
        """Drop sampler state of sessions the host's sweeper evicted, and expired tombstones."""
        now = time.monotonic()
        for key in [key for key, expiry in self.ended.items() if expiry <= now]:
            del self.ended[key]
        self.control_budget.forget_full(now)
        models = [h.model for h in self.host.slices.values() if h.model is not None]
        for sid in list(self.samplers):
            if not any(sid in m.sessions for m in models):
                self.samplers.pop(sid, None)


class ControlBudget:
    """A token bucket per sender for session controls that are not the end of a session the
    sender has in use here (SESSION_CONTROL_BURST, refilled at SESSION_CONTROL_PER_S); past it they
    are dropped, with one WARNING per sender until its bucket refills. At most
    SESSION_CONTROL_MAX_SENDERS buckets are kept (refilled ones go first, then the least recently
    charged: a forgotten bucket is a full one, what a new sender starts with anyway); a sender that
    leaves the peer table is forgotten."""

    def __init__(self) -> None:
        self._buckets: dict[str, list[float]] = {}  # sender -> [tokens, monotonic time of the last take]
        self._warned: set[str] = set()
        self._noted: dict[str, set[str]] = {}  # sender -> what was logged since its bucket was last full
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, sender: str) -> bool:
        now = time.monotonic()
        tokens, at = self._buckets.pop(sender, (float(const.SESSION_CONTROL_BURST), now))
        tokens = min(float(const.SESSION_CONTROL_BURST), tokens + (now - at) * const.SESSION_CONTROL_PER_S)
        if len(self._buckets) >= const.SESSION_CONTROL_MAX_SENDERS:
            self._make_room(now)
        if tokens >= 1.0:
            self._buckets[sender] = [tokens - 1.0, now]  # re-inserted: the most recently charged last
            if tokens >= const.SESSION_CONTROL_BURST / 2:
                self._warned.discard(sender)
            return True
        self._buckets[sender] = [tokens, now]
        self.dropped += 1
        if sender not in self._warned:
            self._warned.add(sender)
            log.warning("DIAG: session controls dropped, the sender is past its budget %s", kv(
                sender=sender[:8], burst=const.SESSION_CONTROL_BURST, per_s=const.SESSION_CONTROL_PER_S))
        return False

    def first(self, sender: str, what: str) -> bool:
        """Whether this is the sender's first `what` since its bucket was last full (and forgotten):
        one line per episode. Call after `take` (the note goes with the sender's bucket)."""
        noted = self._noted.setdefault(sender, set()) if sender in self._buckets else {what}
        if what in noted:
            return False
        noted.add(what)
        return True

    def _make_room(self, now: float) -> None:
        self.forget_full(now)
        while len(self._buckets) >= const.SESSION_CONTROL_MAX_SENDERS:
            self.forget(next(iter(self._buckets)))

    def forget(self, sender: str) -> None:
        """A sender gone from the peer table."""
        self._buckets.pop(sender, None)
        self._warned.discard(sender)
        self._noted.pop(sender, None)

    def forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (what a new sender starts with)."""
        for sender, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * const.SESSION_CONTROL_PER_S >= const.SESSION_CONTROL_BURST:
                self.forget(sender)
