"""The node-wide KV budget of the served slices (NodeConfig `slice_kv_budget_mb`, SliceHost
`kv_budget_bytes`): admission of new sessions, and the sweep that holds the budget.

Admission (2026-12-06). A WORK that opens a session (index_pos 0, or the resume of a kept one) is
refused with KvBudgetFull (code `overloaded`: the coordinator tries another holder of those
layers, or answers its client 429 with Retry-After) when the node's sessions in use — each counted
at what its admission reserved, or at what it holds if more — plus the new session's reserve
would exceed the budget. Kept (finished) sessions do not count: the sweep gives them up first.
With no session in use a session is always admitted (waiting would not make room for it).

The reserve is the KV of the session's layers for twice the positions its attempt prefills (the
opening WORK's `expect`: prompt + tokens generated before a failover; from an older coordinator
the step's own end), at least SESSION_MIN_CAPACITY (const), at most the slice's context: what its cache (grown by
doubling) holds as it decodes, so a reply as long as its prompt never outgrows its admission.
Not the served context: a chat request without max_tokens may generate up to the context, so
that reserve would be the whole context for nearly every request, and a budget would admit a few
requests where most end far before it. A session that does outgrow its reserve is the one way
sessions in use can pass the budget; the sweep then evicts the least recently used of them (the
budget protects the node's memory): the last resort, logged at WARNING. Before 2026-12-06 every
new session was admitted and the sweep evicted sessions in use for it: a reply cut off under load.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node import const
from node.errors import KvBudgetFull
from node.logs import kv

if TYPE_CHECKING:
    from node.inference.pipeline.wire import Work
    from node.inference.slice.session import Session  # torch: only where a slice loads
    # host.SliceHost and host.HostedSlice: not imported, even for types (host.py owns a KvBudget;
    # the import-linter contract forbids the cycle)

log = logging.getLogger(__name__)


def reserve_positions(work: Work, n_ctx: int) -> int:
    """Positions a session opened by `work` is admitted for (see the module's docstring)."""
    prefill = work.expect if work.expect is not None else work.index_pos + work.n_tokens
    return min(n_ctx, max(const.SESSION_MIN_CAPACITY, 2 * prefill))


def reserve_bytes(model: Any, work: Work) -> int:
    """The KV bytes `work`'s new session is admitted for on `model` (its hop's layers only)."""
    hop = work.target
    element = model.kv_dtype.itemsize
    per_position = 2 * (hop.end - hop.start) * model.config.kv_dim * element  # K and V
    return per_position * reserve_positions(work, model.n_ctx)


class KvBudget:
    """Admits new sessions and sweeps, over every slice of `host` (one budget per node)."""

    def __init__(self, host: Any):  # SliceHost
        self.host = host
        self._lock = threading.Lock()  # slices admit on their own executors: one check at a time

    def _live(self) -> list[Any]:
        return [h.model for h in list(self.host.slices.values()) if h.model is not None and h.state != "unloaded"]

    def committed(self) -> int:
        """Bytes counted against the budget: sessions in use (at least their reserves) and kept ones."""
        return sum(sum(m.sessions.bytes_by_kind()) for m in self._live())

    def admit(self, hosted: Any, model: Any, work: Work, node: str, create: Callable[[], Session]) -> Session:
        """Slice's executor thread: the session `create` opens for `work` on `model` (the slice's,
        as the step read it: an unload may clear `hosted.model` meanwhile), reserved for, if the
        node's sessions in use leave room for it; KvBudgetFull (and a DIAG line) if not."""
        budget = self.host.kv_budget_bytes
        need = reserve_bytes(model, work)
        with self._lock:
            in_use = kept = n_in_use = 0
            for m in self._live():
                u, k = m.sessions.bytes_by_kind()
                in_use, kept, n_in_use = in_use + u, kept + k, n_in_use + m.sessions.counts()[0]
            if n_in_use and in_use + need > budget:
                hop = work.target
                log.info("DIAG: KV-cache session refused, the budget is full %s", kv(
                    model=hosted.entry.id, session=work.sid, layers=f"{hop.start}-{hop.end - 1}",
                    coordinator=work.coordinator[:8], need_bytes=need, in_use_bytes=in_use, in_use=n_in_use,
                    kept_bytes=kept, budget_bytes=budget))
                raise KvBudgetFull(
                    f"node {node} is at its KV cache budget ({budget / 2**20:.1f} MiB): {n_in_use} requests in "
                    f"progress hold {in_use / 2**20:.1f} MiB and this one needs {need / 2**20:.1f} MiB for layers "
                    f"{hop.start}-{hop.end - 1} of {hosted.entry.id}; try again shortly")
            sess = create()
            sess.reserved = need
        return sess

    async def async_sweep(self) -> list[str]:
        """Free sessions idle past the TTL, then kept ones over what the sessions in use leave of
        the budget, then (the last resort: sessions that outgrew their reserves) LRU ones in use."""
        host = self.host
        freed: list[str] = []
        loop = asyncio.get_running_loop()
        budget = host.kv_budget_bytes  # per node, over every slice

        async def each(make_args) -> None:
            nonlocal freed
            for hosted in list(host.slices.values()):
                model = hosted.model  # an unload may set it to None while the sweep runs on the executor
                if model is None or hosted.state == "unloaded" or hosted.executor is None:
                    continue
                try:
                    freed += await loop.run_in_executor(hosted.executor, model.sweep_sessions, *make_args(model))
                except RuntimeError:  # the slice was unloaded meanwhile: its executor is shut down
                    continue

        async def kept_over_budget() -> None:
            """Kept sessions over what the sessions in use (at their reserves) leave of the budget,
            node-wide (a slice's kept ones go before another slice's in use)."""
            room = max(0, budget - sum(m.sessions.bytes_by_kind()[0] for m in self._live()))

            def args(model):
                nonlocal room
                _, kept = model.sessions.bytes_by_kind()
                allowed = model.sessions.total_bytes() - kept + room  # what its sessions in use hold
                room = max(0, room - kept)
                return None, allowed, None, True
            await each(args)

        # the TTLs first (what expires anyway must not push kept sessions out), then kept sessions
        # over the budget, then — measured again: sessions grow while the sweep waits behind
        # steps — kept ones again and only then sessions in use, least recently used first
        await each(lambda model: (host.session_ttl_s, None, const.KEPT_SESSION_TTL_S, False))
        await kept_over_budget()
        if sum(m.sessions.total_bytes() for m in self._live()) > budget:
            await kept_over_budget()
            held = sum(m.sessions.total_bytes() for m in self._live())
            if held > budget:
                log.warning("DIAG: KV sessions in use outgrew what they were admitted for, evicting the least "
                            "recently used %s", kv(held_bytes=held, budget_bytes=budget))
            left = budget

            def in_use_args(model):
                nonlocal left
                allowed = left
                left = max(0, left - min(allowed, model.sessions.total_bytes()))
                return None, allowed, None, False
            await each(in_use_args)
        return freed
