"""Per-request KV caches of a slice and the store that owns them (explicit free, TTL, LRU).

A finished session may be *kept* for its coordinator (SESSION_END with keep: prefix reuse across
a conversation's turns): it then computes nothing until a later request of that coordinator
resumes it under its own id, cut to the prefix the two prompts share, or copies that prefix into
a new session and leaves it kept (a shared system prompt). Kept sessions go first when
the store is over its memory budget, and have their own idle TTL.

A session's cache covers only the layers it runs: the slice's own, or a sub-range [a, b) of them
chosen when the session is created (a chain may enter a holder's range in the middle). `kv_len` is the number of positions
written; a forward must start exactly there (seed 000, gotcha #400: never compute from a gap).
Capacity grows by doubling up to the model's context, so short requests stay small.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

import torch

from node import const
from node.errors import ContextLengthExceeded, KvCacheMiss
from node.logs import kv

log = logging.getLogger(__name__)

MIN_CAPACITY = const.SESSION_MIN_CAPACITY  # positions allocated on a session's first forward


class Session:
    """KV cache of one request on one slice (batch 1), for layers [layer_start, layer_end)."""

    def __init__(self, session_id: str, shape: tuple[int, int, int], max_ctx: int, dtype, device,
                 layer_start: int = 0):
        self.session_id = session_id
        self.n_layers, self.n_kv, self.head_dim = shape
        self.layer_start = layer_start  # absolute index of the first layer this session runs
        self.layer_end = layer_start + self.n_layers
        self.max_ctx = max_ctx
        self.dtype, self.device = dtype, device
        self.kv_len = 0
        self.capacity = 0
        self.k = self.v = torch.empty(0)
        self.created = self.last_used = time.monotonic()
        self.kept_for: str | None = None  # kept (finished): the coordinator that may resume it
        self.coordinator: str | None = None  # the node whose request created it (None: any may keep it)
        self.upstream: str | None = None  # the node whose step opened it (its later steps come from it)
        self.reserved = 0  # bytes the node's KV admission counted for it (pipeline/kvbudget.py)

    @property
    def nbytes(self) -> int:
        """Bytes held by the caches."""
        return 2 * self.k.numel() * self.k.element_size()

    def reserve(self, end: int) -> None:
        """Make room for positions [0, end), growing by doubling (copies what is written)."""
        if end <= self.capacity:
            return
        if end > self.max_ctx:
            raise ContextLengthExceeded(
                f"position {end} exceeds the slice's context of {self.max_ctx} tokens (session {self.session_id})"
            )
        cap = min(self.max_ctx, max(end, 2 * self.capacity, MIN_CAPACITY))
        shape = (self.n_layers, self.n_kv, cap, self.head_dim)
        k = torch.empty(shape, dtype=self.dtype, device=self.device)
        v = torch.empty(shape, dtype=self.dtype, device=self.device)
        if self.kv_len:
            k[:, :, : self.kv_len] = self.k[:, :, : self.kv_len]
            v[:, :, : self.kv_len] = self.v[:, :, : self.kv_len]
        self.k, self.v, self.capacity = k, v, cap

    def copy_prefix(self, session_id: str, keep: int, coordinator: str | None, room: int = 0) -> Session:
        """A new session `session_id` over the same layers holding a copy of positions [0, keep),
        with capacity for `room` more (the step that follows: no second reallocation)."""
        out = Session(session_id, (self.n_layers, self.n_kv, self.head_dim), self.max_ctx, self.dtype,
                      self.device, self.layer_start)
        out.coordinator = coordinator
        out.reserve(min(keep + room, self.max_ctx))
        out.k[:, :, :keep] = self.k[:, :, :keep]
        out.v[:, :, :keep] = self.v[:, :, :keep]
        out.kv_len = keep
        return out

    def truncate(self, kv_len: int) -> None:
        """Forget positions >= kv_len (e.g. to re-run from a point the caller chooses)."""
        self.kv_len = min(self.kv_len, max(0, kv_len))


class SessionStore:
    """Sessions of one slice model, oldest-used first; thread-safe."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def add(self, session: Session) -> Session:
        """Register a new session (replacing one with the same id)."""
        with self._lock:
            old = self._sessions.pop(session.session_id, None)
            self._sessions[session.session_id] = session
        if old is not None:
            self._log_evicted(old, "replaced")
        return session

    def get(self, session_id: str) -> Session | None:
        """The session in use, marked as just used, or None (a kept one is resumed under a new id,
        never stepped under its own: a late step of its ended request must not write into it)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is not None and s.kept_for is not None:
                return None
            if s is not None:
                self._sessions.move_to_end(session_id)
                s.last_used = time.monotonic()
            return s

    def peek(self, session_id: str) -> Session | None:
        """The session, kept or in use, without marking it used (inspection)."""
        with self._lock:
            return self._sessions.get(session_id)

    def keep(self, session_id: str, coordinator: str) -> Session | None:
        """Keep a finished session for `coordinator` to resume (None if it is not here, or was
        created for another coordinator)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is not None and s.coordinator not in (None, coordinator):
                s = None
            if s is not None:
                s.kept_for = coordinator
                s.last_used = time.monotonic()
                self._sessions.move_to_end(session_id)
        return s

    def resume(self, kept_id: str, session_id: str, keep: int, coordinator: str, start: int, end: int,
               copy: bool = False, room: int = 0) -> Session:
        """The kept session `kept_id`, now `session_id`, holding its first `keep` positions;
        KvCacheMiss (with the reason) unless it is kept for this coordinator over these layers.
        `copy`: `session_id` is a new session holding a copy of those positions and the kept one
        stays kept, whole (a shared system prompt of another conversation). The copy is made under
        the lock: a resume of the same kept session (a rename, then writes past its own prefix)
        cannot interleave with it."""
        with self._lock:
            s = self._sessions.get(kept_id)
            if s is None:
                reason = "evicted"
            elif s.kept_for is None:
                reason = "not_kept"
            elif s.kept_for != coordinator:
                reason = "other_coordinator"
            elif (s.layer_start, s.layer_end) != (start, end):
                reason = "layers_differ"
            elif s.kv_len < keep:
                reason = "shorter_than_prefix"
            elif session_id in self._sessions:
                reason = "session_exists"
            elif copy:
                reason = None
                s.last_used = time.monotonic()
                self._sessions.move_to_end(kept_id)
                s = s.copy_prefix(session_id, keep, coordinator, room)
                self._sessions[session_id] = s
            else:
                reason = None
                del self._sessions[kept_id]
                s.session_id, s.kept_for = session_id, None
                s.truncate(keep)
                s.last_used = time.monotonic()
                self._sessions[session_id] = s
        if reason is not None:
            raise KvCacheMiss(kept_id, reason)
        return s

    def bytes_by_kind(self) -> tuple[int, int]:
        """(in use, kept) bytes; a session in use counts what its admission reserved while it holds
        less (it grows to that as it prefills and decodes), as long as it is stepped: one idle for
        KV_RESERVE_IDLE_S counts what it holds (a coordinator gone mid-request, or a member that
        opens sessions reserving the whole context and never steps them, held the budget's room
        for the session TTL and every new session was refused)."""
        now = time.monotonic()
        with self._lock:
            kept = sum(s.nbytes for s in self._sessions.values() if s.kept_for is not None)
            in_use = sum(max(s.nbytes, s.reserved if now - s.last_used < const.KV_RESERVE_IDLE_S else 0)
                         for s in self._sessions.values() if s.kept_for is None)
            return in_use, kept

    def counts(self) -> tuple[int, int]:
        """(active, kept) sessions."""
        with self._lock:
            kept = sum(1 for s in self._sessions.values() if s.kept_for is not None)
            return len(self._sessions) - kept, kept

    def free_kept(self, reason: str = "draining") -> list[str]:
        """Drop every kept session (their slice stops serving: nobody can resume them); logs each."""
        with self._lock:
            gone = [self._sessions.pop(sid) for sid, s in list(self._sessions.items()) if s.kept_for is not None]
        for s in gone:
            self._log_evicted(s, reason)
        return [s.session_id for s in gone]

    def free_coordinator(self, coordinator: str, reason: str = "coordinator_gone", *,
                         kept: bool = False) -> list[Session]:
        """Drop the sessions in use that `coordinator` opened (its link is gone: it fails those
        attempts over, with new sessions); kept ones stay for its next turn, unless `kept` (it
        restarted: the new process knows nothing of them). Logs each; the sessions dropped."""
        with self._lock:
            gone = [self._sessions.pop(sid) for sid, s in list(self._sessions.items())
                    if (s.kept_for == coordinator if s.kept_for is not None else s.coordinator == coordinator)
                    and (kept or s.kept_for is None)]
        for s in gone:
            self._log_evicted(s, reason)
        return gone

    def free(self, session_id: str, reason: str = "freed", *, unless_kept: bool = False) -> bool:
        """Drop a session; True if it existed. `unless_kept`: a kept one stays (a late step of its
        ended attempt is dropped, not what its SESSION_END kept)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is not None and unless_kept and s.kept_for is not None:
                return False
            s = self._sessions.pop(session_id, None)
        if s is not None:
            self._log_evicted(s, reason)
        return s is not None

    def total_bytes(self) -> int:
        """Bytes held by all caches."""
        with self._lock:
            return sum(s.nbytes for s in self._sessions.values())

    def sweep(self, ttl_s: float | None = None, max_bytes: int | None = None,
              kept_ttl_s: float | None = None, kept_only: bool = False) -> list[str]:
        """Evict sessions idle longer than ttl_s (kept ones: kept_ttl_s, default ttl_s), then
        least-recently-used ones over max_bytes, kept ones before any in use (`kept_only`:
        only kept ones)."""
        now = time.monotonic()
        kept_ttl_s = ttl_s if kept_ttl_s is None else kept_ttl_s
        evicted: list[tuple[Session, str]] = []
        with self._lock:
            for sid, s in list(self._sessions.items()):
                limit = kept_ttl_s if s.kept_for is not None else ttl_s
                if limit is not None and now - s.last_used > limit:
                    evicted.append((self._sessions.pop(sid), "ttl"))
            if max_bytes is not None:
                total = sum(s.nbytes for s in self._sessions.values())
                order = sorted(self._sessions.values(), key=lambda s: s.kept_for is None)  # stable: LRU within each
                for s in order:
                    if total <= max_bytes or (kept_only and s.kept_for is None):
                        break
                    del self._sessions[s.session_id]
                    total -= s.nbytes
                    evicted.append((s, "memory_pressure"))
            remaining = len(self._sessions)
        for s, reason in evicted:
            self._log_evicted(s, reason, now)
        if evicted:
            log.info("DIAG: KV-cache store cleanup — expired entries removed %s", kv(removed=len(evicted), remaining=remaining))
        return [s.session_id for s, _ in evicted]

    def _log_evicted(self, s: Session, reason: str, now: float | None = None) -> None:
        idle = (now or time.monotonic()) - s.last_used
        level = logging.DEBUG if reason == "freed" else logging.INFO  # a normal end is per-request
        log.log(
            level,
            "DIAG: KV-cache session evicted %s",
            kv(model=self.model_name, session=s.session_id, reason=reason, kv_len=s.kv_len,
               bytes=s.nbytes, idle_s=f"{idle:.1f}", kept=s.kept_for is not None),
        )
