"""`--serve auto`: this node chooses which layers of each model to serve, loads them, announces
them, and moves when the swarm clearly gains (the rule is layerchoice.py's; this is the I/O).

The swarm's coverage comes from peers' HELLO adverts (`swarm_coverage`, also what diagnostics'
`-- swarm coverage --` prints). The first choice waits a random 0..AUTO_SERVE_START_DELAY_S and
at least AUTO_SERVE_LOOK_S after start (links come up, so nodes starting together see each
other), then re-evaluates when a peer's served layers appear or vanish (after a jittered
AUTO_SERVE_REACT_S) and every `serve_reevaluate_s` ±20 % (a move for throughput alone once
AUTO_SERVE_BALANCE_ROUNDS of those periodic rounds in a row found it). A move loads the new range
first (the old one keeps serving), re-checks that dropping the old range leaves every one of its
layers a holder (else it unloads the new one: aborted), announces, stops advertising the old range,
and frees it once no session uses it or after AUTO_SERVE_DRAIN_S.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from node import const
from node.inference.pipeline import layerchoice as lc
from node.inference.pipeline.budgets import AutoModel, BudgetShares, ChoiceFailure
from node.inference.pipeline.choice_controls import ChoiceControls
from node.inference.pipeline.coverage import (
    ModelCoverage,
    coverage_text,
    swarm_coverage,
)
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.hosted import HostedSlice
from node.inference.pipeline.moves import Moves
from node.logs import kv
from node.models.catalog import ModelEntry
from node.observe import Observers

log = logging.getLogger(__name__)


class PeerView(Protocol):
    """What the chooser reads of the peer network (node.net.PeerManager)."""

    def peers(self) -> list[Any]: ...  # PeerSnapshot: node_id, state, models

    def subscribe(self, callback: Callable[[str, Any], None]) -> Callable[[], None]: ...


# --- the chooser ---

class AutoServe(ChoiceControls, Moves, BudgetShares):
    """Chooses, loads, announces and moves this node's slices of each `--serve auto` model."""

    def __init__(self, node_id: str, host: SliceHost, peers: PeerView | None, entries: Sequence[ModelEntry], *,
                 announce: Callable[[], Awaitable[None]], budget_mb: int = 0,
                 reevaluate_s: float = const.AUTO_SERVE_REEVALUATE_S, note: Callable[[str], None] | None = None):
        self.node_id = node_id
        self.host = host
        self.peers = peers
        self.announce = announce
        self.budget_mb = budget_mb
        self.reevaluate_s = reevaluate_s
        self.note = note or (lambda text: None)
        # the tie-break seed comes from the model, so every node agrees on who moves first
        self.models = [AutoModel(e, int(e.sha256[:8], 16)) for e in entries]
        self.rng = random.Random()
        self.decisions: list[str] = []  # recent DIAG choosing-layers lines (tests, GUI)
        self._wake = asyncio.Event()
        self._why = "periodic"
        self._signature: frozenset = frozenset()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._drains: set[asyncio.Task] = set()
        self._unsubscribe: Callable[[], None] | None = None
        self.paused = False  # "Pause contributing": chooses nothing, holds no slice
        self._loads: dict[str, asyncio.Task] = {}  # model sha256 -> its slice load in progress
        self._retry: asyncio.TimerHandle | None = None
        # peers' loading ranges -> (first seen, last seen moving, bytes fetched then), loop time
        self._claims: dict[tuple[str, str, int, int], tuple[float, float, int]] = {}
        self._stale: asyncio.TimerHandle | None = None  # wakes the chooser when the oldest claim goes stale
        self.failures_changed: Observers[[]] = Observers("autoserve failures")  # failures() changed (the app)

    @property
    def settled(self) -> bool:
        """Every model given at start has had its first choice (loaded, or nothing fits), or
        contributing is paused."""
        return self.paused or all(m.settled for m in self.models if m.at_start)

    @property
    def chooses_at_start(self) -> bool:
        """Models were given at start (`--serve auto`): the node is ready once they are chosen."""
        return any(m.at_start for m in self.models)

    async def _async_load(self, m: AutoModel, d: lc.Decision, **kwargs: Any) -> HostedSlice | None:
        """host.async_load as a task of its own, which a remove or a pause cancels (a partial
        model's layers stop arriving; what arrived stays for a later load). None when cancelled so."""
        if not self._wanted(m) or m.budget is None:  # paused, removed or re-budgeted during an await
            return None
        task = asyncio.ensure_future(self.host.async_load(
            m.entry, d.start, d.end, auto_budget=(m.budget.layers, m.budget.with_head),
            retrying=m.last_failure.reason if m.last_failure is not None else None, **kwargs))
        self._loads[m.entry.sha256] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves (the node stops)
            return None
        finally:
            if self._loads.get(m.entry.sha256) is task:
                del self._loads[m.entry.sha256]

    async def _async_release(self, m: AutoModel, *, keep_parts: bool = False) -> None:
        """Stop a load in progress; stop advertising the model's slices; free each once idle."""
        loading = self._loads.pop(m.entry.sha256, None)
        if loading is not None:
            loading.cancel()
        mine = self.host.for_model(m.entry.sha256)
        for hosted in mine:
            self.host.drain(hosted)
        if mine:
            await self.announce()
        for hosted in mine:  # (one still loading is freed by the evaluation loading it, see _wanted)
            task = asyncio.create_task(self._async_free(hosted, keep_parts=keep_parts), name="autoserve-release")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    def _loaded(self, m: AutoModel, hosted: HostedSlice | None) -> None:
        """Count a load's outcome. A failed one (the origin or the peers holding the parts were
        unreachable, a part did not verify) is chosen again after AUTO_SERVE_RETRY_MIN_S, doubling
        up to the periodic round: it waited for that round (~2 min), its layers uncovered for all
        of it when this node was to be their holder (a swarm test, 2026-12-06)."""
        if hosted is None or hosted.state == "unloaded":
            return
        if hosted.state == "loaded":
            m.failures = 0
            self._set_failure(m, None)
            if not self._wanted(m):
                return  # paused or removed meanwhile: a pause keeps the parts
            # the parts of ranges kept for a return (a pause, a new budget, the range on disk at a
            # restart when the swarm needed another) go once a choice has loaded: they grew the
            # file on disk to the whole model (a swarm test, 2026-12-06)
            task = asyncio.create_task(self.host.async_trim_parts(m.entry), name="autoserve-trim")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
            return
        if not self._wanted(m):
            # paused or removed as it failed (the load had ended before the release could cancel it):
            # no failure, no retry timer (2026-12-07: one was kept after async_pause had cleared it)
            return
        m.failures += 1
        # its file holds other bytes than its sha256 names (the host refused it, node.models.changed):
        # chosen again at the periodic round only (the check hashes once per change), or at once when
        # the file is added or helped again: its old bytes may be back. (2026-12-07, review r32: it was
        # never chosen again, whatever the user did but a new budget, a pause or a restart)
        changed = hosted.refused_changed  # (not entry.changed: a touch marks it, and a load failing for another
        # reason, a file unreadable for a while, was then not retried soon; review r32)
        delay = self.reevaluate_s if changed else \
            min(self.reevaluate_s, const.AUTO_SERVE_RETRY_MIN_S * 2 ** min(m.failures - 1, 20))
        loop = asyncio.get_running_loop()
        if self._retry is not None and self._retry.when() <= loop.time() + delay:
            delay = max(0.0, self._retry.when() - loop.time())  # an earlier retry wakes every model's evaluation
        else:
            if self._retry is not None:
                self._retry.cancel()
            self._retry = loop.call_later(delay, self._retry_now)
        # kept (the slice itself is unloaded now) for the app, diagnostics and the admin API: the app
        # went back to "no model can serve" and nothing said why (2026-12-07)
        now = time.time()
        self._set_failure(m, ChoiceFailure(m.entry.id, hosted.start, hosted.end, hosted.error or "unknown error",
                                           now, now + delay, m.failures))
        log.info("DIAG: slice load failed, choosing again %s %s", "later" if changed else "soon", kv(
            model=m.entry.id, layers=f"{hosted.start}-{hosted.end - 1}", failures=m.failures,
            retry_in_s=round(delay, 1), reason=hosted.error))
        self.note(m.last_failure.text())

    def _set_failure(self, m: AutoModel, failure: ChoiceFailure | None) -> None:
        if m.last_failure is not failure:
            m.last_failure = failure
            self.failures_changed.emit()

    def failures(self) -> list[ChoiceFailure]:
        """The last failed load of each model whose later choice has not loaded yet (paused: none)."""
        return [] if self.paused else [m.last_failure for m in self.models if m.last_failure is not None]

    def _retry_now(self) -> None:
        self._retry = None
        self._why = "retry"
        self._wake.set()

    def _wanted(self, m: AutoModel) -> bool:
        return not self.paused and m in self.models

    def start(self) -> None:
        """Begin choosing (on the loop)."""
        if self.peers is not None:
            self._signature = self._peer_signature()
            self._unsubscribe = self.peers.subscribe(self._on_peer)
        self._task = asyncio.create_task(self._async_run(), name="autoserve")

    async def async_stop(self) -> None:
        self._stopping = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None  # (a second stop is a no-op)
        if self._retry is not None:
            self._retry.cancel()
        if self._stale is not None:
            self._stale.cancel()
        tasks = [self._task, *self._drains, *self._loads.values()]
        for task in tasks:
            if task is not None:
                task.cancel()
        for task in tasks:
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: PERF203 (stopping: errors were logged)
                    pass

    # --- triggers ---

    def _peer_signature(self) -> frozenset:
        return frozenset((p.node_id, m.get("sha256"), m.get("start"), m.get("end"))
                         for p in self.peers.peers() if p.state == "connected" for m in p.models
                         if isinstance(m, Mapping))

    def _on_peer(self, event: str, snap: Any) -> None:
        """Peer observer: wake the chooser when what peers serve changed (joins, leaves, moves)."""
        signature = self._peer_signature()
        if signature == self._signature:
            return
        gone = {n for n, *_ in self._signature} - {n for n, *_ in signature}
        self._why = "peer_left" if gone else "peer_changed"
        self._signature = signature
        self._wake.set()

    def coverage(self) -> dict[str, ModelCoverage]:
        """The swarm's coverage as the choice reads it. A peer's claim (a range advertised loading)
        counts as a holder of its layers until its fetch has not moved for AUTO_SERVE_CLAIM_STALE_S
        (the advert's `fetch` bytes; a claim that gives none, or whose fetch only trickles on,
        from its first sight, at most AUTO_SERVE_CLAIM_MAX_S): a claimer whose origin stalls held
        its layers, so the model uncovered, for as long as the fetch lasted, while nodes that
        could cover them did not; and a claimer whose fetch merely took over a minute (any real
        slice over Wi-Fi) lost its claim, and a second node fetched the same layers."""
        covs = swarm_coverage(self.node_id, self.host.adverts(), self.peers.peers() if self.peers else [])
        loop = asyncio.get_running_loop()
        now, live, soonest = loop.time(), set(), None
        for cov in covs.values():
            for span in cov.loading:
                key = (cov.sha256, span.node_id, span.start, span.end)
                live.add(key)
                done = cov.fetched.get((span.node_id, span.start, span.end))
                first, moved, was = self._claims.get(key, (now, now, -1))
                if done is not None and done > was:
                    moved, was = now, done
                self._claims[key] = (first, moved, was)
                stale_at = min(moved + const.AUTO_SERVE_CLAIM_STALE_S, first + const.AUTO_SERVE_CLAIM_MAX_S)
                if now >= stale_at:
                    cov.spans.remove(span)
                elif soonest is None or stale_at < soonest:
                    soonest = stale_at
        for key in [k for k in self._claims if k not in live]:
            del self._claims[key]
        if soonest is not None and (self._stale is None or self._stale.when() > soonest + 0.1):
            if self._stale is not None:
                self._stale.cancel()
            self._stale = loop.call_at(soonest + 0.1, self._claim_stale)
        return covs

    def _claim_stale(self) -> None:
        self._stale = None
        self._why = "claim_stale"
        self._wake.set()

    # --- the loop ---

    async def _async_run(self) -> None:
        loop = asyncio.get_running_loop()
        for m in list(self.models):
            await self._async_budget(m, loop)
        await asyncio.sleep(const.AUTO_SERVE_LOOK_S + self.rng.uniform(0, const.AUTO_SERVE_START_DELAY_S))
        why = "start"
        # the periodic round keeps its own clock, from the end of the last one (or the start): a
        # peer event in between is acted on and does not put it off (peers joining or moving more
        # often than the period starved it, and with it every throughput move, which only that
        # round makes)
        periodic_at = 0.0
        while True:
            self._wake.clear()  # a change while we evaluate or load wakes the next round at once
            for m in list(self.models):  # (the desktop app adds and removes models meanwhile)
                if not self._wanted(m):
                    continue
                try:
                    if m.budget is None and m.budget_error is None:  # added while running, or re-budgeted
                        await self._async_budget(m, loop)
                    await self._async_evaluate(m, why)
                except Exception:
                    log.exception("layer choice for %s failed", m.entry.id)
                m.settled = True
            if why in ("start", "periodic"):
                periodic_at = loop.time() + self.reevaluate_s * self.rng.uniform(0.8, 1.2)
            try:
                # (not wait_for: on Python 3.11 a cancel landing as the wake completes was lost, and
                # async_stop waited for this loop forever — a peer event just before a stop)
                async with asyncio.timeout(max(0.0, periodic_at - loop.time())):
                    await self._wake.wait()
            except TimeoutError:
                why = "periodic"
                continue
            if self._stopping:
                return
            why = self._why
            await asyncio.sleep(const.AUTO_SERVE_REACT_S * self.rng.uniform(1.0, 3.0))

    def _log(self, m: AutoModel, range_text: str, before: str, after: str, reason: str) -> None:
        line = kv(model=m.entry.id, range=range_text, budget_mb=m.budget_mb, coverage_before=before,
                  coverage_after=after, reason=reason)
        log.info("DIAG: choosing layers %s", line)
        self.decisions.append(line)
        del self.decisions[:-50]

    async def _async_evaluate(self, m: AutoModel, why: str) -> None:
        """Choose for `m` (below). A choice that loads nothing (the budget fits no layer now, no move,
        a failed move's old range serving on) ends the last failure: nothing retries it. It stayed
        shown for ever, "chosen again at" a time long past (2026-12-07, review r27)."""
        before = m.last_failure
        await self._async_choose(m, why)
        if before is not None and m.last_failure is before and self._wanted(m):
            self._set_failure(m, None)

    async def _async_choose(self, m: AutoModel, why: str) -> None:
        entry, n = m.entry, m.entry.n_layers
        if m.budget is None:
            return
        if why == "periodic":
            m.periodic_rounds += 1
        cov = self.coverage().get(entry.sha256) or ModelCoverage(entry.sha256, entry.name, n)
        mine = self.host.for_model(entry.sha256)
        others = [s for s in cov.spans if s.node_id != self.node_id]
        if not mine:
            held = frozenset(entry.partial.held_layers) if entry.partial is not None else frozenset()
            d = lc.choose_range(n, others, m.budget, self.node_id, m.seed, held=held)
            if d is None:
                if not m.settled:
                    self._log(m, "none", coverage_text(n, others), coverage_text(n, others), "budget_fits_no_layer")
                return
            after = coverage_text(n, [*others, lc.Span(self.node_id, d.start, d.end)])
            self._log(m, d.range_text, coverage_text(n, others), after, f"{why}:{d.reason.replace(' ', '_')}")
            claim = None
            if entry.partial is not None:  # its layers cost origin bytes: claim them before fetching
                before = {(s.node_id, s.start, s.end) for s in others}

                async def claim() -> bool:
                    """Announced as loading, then a moment for a peer that chose at the same instant:
                    of two overlapping claims the lower node id keeps its choice."""
                    await self.announce()
                    await asyncio.sleep(const.AUTO_SERVE_REACT_S)
                    now = self.coverage().get(entry.sha256)
                    rivals = [s for s in (now.spans if now else []) if s.node_id < self.node_id
                              and (s.node_id, s.start, s.end) not in before and s.start < d.end and d.start < s.end]
                    if rivals:
                        self._log(m, d.range_text, coverage_text(n, others), coverage_text(n, now.spans),
                                  f"yielded_to_{rivals[0].node_id[:8]}")
                        return False
                    return True
            hosted = await self._async_load(m, d, claim=claim)
            self._loaded(m, hosted)
            if hosted is None:  # cancelled: removed or paused while it loaded
                await self.announce()
                return
            if hosted.state in ("loaded", "failed") and not self._wanted(m):  # paused or removed meanwhile
                await self._async_give_up(hosted)
                await self.announce()
                return
            if hosted.state == "unloaded":  # yielded to a peer's claim: choose again at once
                await self.announce()  # (the loading advert goes)
                self._why = "peer_changed"
                self._wake.set()
                return
            if hosted.state == "loaded":
                self.note(f"serving layers {d.range_text} of {entry.id} (chosen)")
                await self.announce()
            else:
                # failed (the host logged why): try again soon, with the parts it did fetch (a
                # retry from zero every few seconds would never finish a range on a flaky origin)
                await self.host.async_unload(hosted, keep_parts=True)
            return
        if len(mine) != 1:
            return  # mid-move
        budgets = {**cov.budgets, self.node_id: m.budget}
        balance = why not in ("peer_left", "peer_changed", "claim_stale")  # throughput: on the periodic round
        found = lc.first_mover(n, cov.spans, budgets, m.seed, balance=balance)
        if found is None:
            m.deferred_to, m.deferred_rounds = None, 0
            return
        decision = found[1]
        if found[0] != self.node_id:
            # wait for the first mover, but not for ever: a peer whose view differs (no full mesh,
            # a relay) or that never moves would stall every move. After AUTO_SERVE_DEFER_ROUNDS
            # rounds on the same coverage, act on this node's own decision.
            seen = (found[0], coverage_text(n, cov.spans))
            m.deferred_rounds = m.deferred_rounds + 1 if m.deferred_to == seen else 1
            m.deferred_to = seen
            if m.deferred_rounds <= const.AUTO_SERVE_DEFER_ROUNDS:
                return
            decision = lc.should_move(n, cov.spans, self.node_id, m.budget, m.seed, balance=balance)
            if decision is None:
                return
            log.info("DIAG: first mover did not move; moving on our own %s", kv(
                model=entry.id, waited_for=found[0][:8], rounds=m.deferred_rounds - 1))
        if decision.for_throughput and not m.confirms((mine[0].start, mine[0].end), decision, why):
            return  # (speeds are noisy: a gain in throughput alone must hold for several rounds)
        m.deferred_to, m.deferred_rounds = None, 0
        await self._async_move(m, mine[0], decision, cov, why)
