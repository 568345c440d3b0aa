"""The budget side of `--serve auto` (autoserve.py is the choosing): each model's memory budget,
in layers. The node's budget (`--slice-budget-mb`, else free memory plus what its chosen slices
take from it now) is shared by the models without a budget of their own by water-filling: each
gets an equal part, capped at what it can use (all its layers, the head and their KV reserve),
and what a capped model leaves is shared among the others (`water_fill`). A change in their set
sizes each again, and a slice that no longer fits its share is freed (or its load cancelled) and
chosen again."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node import const
from node.inference.pipeline import layerchoice as lc
from node.inference.pipeline.coverage import SliceSizes, default_budget_bytes, slice_sizes
from node.inference.pipeline.host import SliceHost
from node.logs import kv, utc_clock
from node.models.catalog import ModelEntry

log = logging.getLogger("node.inference.pipeline.autoserve")  # one logger for the layer choice's lines


@dataclass(frozen=True)
class ChoiceFailure:
    """The last load of a layer choice that failed (kept until a later choice of the model loads):
    the failed slice itself is unloaded at once, so without it nothing said why nothing served."""

    model: str
    start: int
    end: int
    reason: str
    at: float  # wall clock (time.time()) of the failure
    retry_at: float  # wall clock of the next choice
    failures: int  # failed loads in a row

    def summary(self) -> dict:
        return {"model": self.model, "layers": [self.start, self.end - 1], "reason": self.reason,
                "at": round(self.at, 3), "retry_at": round(self.retry_at, 3),
                "failures": self.failures}

    def text(self, *, retrying: bool = False, clock: Callable[[float], str] = utc_clock) -> str:
        """One line for people: "layers 0–1 of X failed to load: why; chosen again at 01:02:03"
        (`retrying`: a later choice is loading now, "…; retrying…"); the time UTC marked Z, as node.log
        and the report say it, or as `clock` says it (the app: local time, as its Swarm tab, review r74)."""
        when = "retrying…" if retrying else f"chosen again at {clock(self.retry_at)}"
        return (f"layers {self.start}–{self.end - 1} of {self.model} (chosen automatically) failed to load: "
                f"{self.reason}; {when}")


@dataclass
class AutoModel:
    """One model whose layers this node chooses."""

    entry: ModelEntry
    seed: int
    budget: lc.LayerBudget | None = None
    budget_mb: int = 0
    settled: bool = False
    sizes: SliceSizes | None = None
    deferred_to: tuple[str, str] | None = None  # (the first mover we wait for, the coverage we saw)
    deferred_rounds: int = 0
    budget_mb_override: int | None = None  # a budget for this model alone (the GUI's slider); None: the node's
    budget_error: str | None = None  # why its layers could not be sized (nothing of it is served)
    at_start: bool = True  # given at start (`--serve auto`); False: added while running (`settled` ignores it)
    # given on the command line (`--serve auto`: at start, or a `--model URL` whose origin answered
    # late); False: added by "Help serve" only, which an untick ends
    given: bool = True
    failures: int = 0  # slice loads that failed in a row (each retried sooner than the periodic round)
    last_failure: ChoiceFailure | None = None  # the last failed load, until a later choice loads
    periodic_rounds: int = 0  # periodic evaluations so far (a throughput move must be found on consecutive ones)
    balance_seen: tuple[tuple[int, int, int, int], int, int] | None = None  # (from, to), times found in a row, round

    def confirms(self, old: tuple[int, int], d: lc.Decision, why: str) -> bool:
        """Whether to make a move for throughput alone (`d.for_throughput`) from the range `old`:
        on a periodic round that found it for the AUTO_SERVE_BALANCE_ROUNDS-th time in a row.
        Advertised speeds are measured (decode steps' EWMA) and move with the machine's load, so
        one round's clear gain may be noise: on speeds alternating by ±25 % a spare node moved back
        and forth every round, each move a load (maybe a fetch) and drained sessions."""
        if why != "periodic":
            return False
        move = (*old, d.start, d.end)
        seen, rounds, at = self.balance_seen or (None, 0, -1)
        rounds = rounds + 1 if seen == move and at == self.periodic_rounds - 1 else 1
        self.balance_seen = (move, rounds, self.periodic_rounds)
        if rounds < const.AUTO_SERVE_BALANCE_ROUNDS:
            log.info("DIAG: throughput move waits for the next rounds %s", kv(
                model=self.entry.id, old=f"{old[0]}-{old[1] - 1}", range=d.range_text,
                found=f"{rounds}/{const.AUTO_SERVE_BALANCE_ROUNDS}", before=d.before.describe(),
                after=d.after.describe()))
            return False
        self.balance_seen = None
        return True


def whole_bytes(sizes: SliceSizes) -> int:
    """What a model can use of a budget: all its layers with their KV reserve, and the head
    (layers_for_budget of it fits the whole model, with the head)."""
    return sizes.n_layers * (sizes.per_layer_bytes + sizes.kv_per_layer_bytes) + sizes.head_bytes


def water_fill(total: int, needs: Sequence[int]) -> list[int]:
    """`total` split among models that can use `needs` bytes each: equal parts, but none above its
    need; what a capped model leaves is split among the rest, again and again. An equal split
    gave a 1.3 GB model and a 7 GB one 4 GB each of 8 GB: 2.7 GB idle, and the big model left
    with layers nobody held across a swarm of such nodes (2026-12-06)."""
    shares = [0] * len(needs)
    left, open_ = max(0, int(total)), sorted(range(len(needs)), key=lambda i: needs[i])
    while open_:
        even = left // len(open_)
        if max(0, needs[open_[0]]) > even:  # the smallest need left is over an equal part: so are all
            for i in open_:
                shares[i] = even
            break
        i = open_.pop(0)
        shares[i] = max(0, needs[i])
        left -= shares[i]
    return shares


class BudgetShares:
    """Sizing for AutoServe (which provides models, host, budget_mb and _async_release)."""

    models: list[AutoModel]
    host: SliceHost
    budget_mb: int

    async def _async_release(self, m: AutoModel, *, keep_parts: bool = False) -> None:
        raise NotImplementedError

    def _sharing(self) -> list[AutoModel]:
        """The models that share the node's budget: those without a budget of their own. Two
        models each sized to the whole `--slice-budget-mb` (or to all free memory) held 1.1 times
        it (a swarm test, 2026-12-06); now each gets its share (`water_fill`)."""
        return [m for m in self.models if not m.budget_mb_override]

    async def _async_reshare(self) -> None:
        """The models sharing the node's budget changed: each of them is sized again.
        A slice that still fits its new share stays as it is; one that does not is freed and its
        layers chosen again within the share (as a new budget does; the part files are kept)."""
        loop = asyncio.get_running_loop()
        for m in self._sharing():
            if m.budget is None and m.budget_error is None:
                continue  # not sized yet (being added): sized with the others' share when it is
            m.budget_error = None
            await self._async_budget(m, loop)
            if m.budget is None:
                continue  # could not be sized (logged): its slices are left as they are
            budget = m.budget
            too_big = [s for s in self.host.slices.values()  # loading ones too: a load under way is cancelled
                       if s.entry.sha256 == m.entry.sha256 and s.state in ("loading", "loaded")
                       and s.auto_budget is not None
                       and s.end - s.start > (budget.with_head if s.end == m.entry.n_layers else budget.layers)]
            if too_big:
                m.budget, m.settled = None, False  # (sized again at the next evaluation, after the release)
                await self._async_release(m, keep_parts=True)

    def _held_bytes(self, m: AutoModel) -> int:
        """The memory this node's layer-choice slices of `m` take from free memory now: the weights
        of those in RAM and the KV their sessions hold (KV is allocated as sessions grow, the
        rest of the reserve is still free). Draining ones are left out: until their sessions end,
        their memory is not there to give."""
        sizes, total = m.sizes, 0
        if sizes is None:
            return 0
        for s in self.host.for_model(m.entry.sha256):
            if s.auto_budget is None or s.placement is None or s.placement.gpu_index is not None:
                continue
            total += (s.end - s.start) * sizes.per_layer_bytes + (sizes.head_bytes if s.end == m.entry.n_layers else 0)
            total += s.model.sessions.total_bytes() if s.model is not None else 0
        return total

    async def _async_budget(self, m: AutoModel, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await self._async_size(m, loop)
        except Exception as exc:  # an architecture the slice engine cannot size: serve nothing of it
            m.budget_error = str(getattr(exc, "message", exc))
            log.error("DIAG: slice budget failed %s", kv(model=m.entry.id, error=m.budget_error))

    async def _async_sizes(self, m: AutoModel, loop: asyncio.AbstractEventLoop) -> SliceSizes:
        if m.sizes is None:
            m.sizes = await loop.run_in_executor(None, functools.partial(
                slice_sizes, m.entry.path, self.host.dtype, self.host.context_for(m.entry),
                kv_dtype=self.host.kv_dtype))
        return m.sizes

    async def _async_needs(self, loop: asyncio.AbstractEventLoop) -> None:
        """Size every model sharing the node's budget (its share depends on what the others can
        use). One that cannot be sized can use nothing: its own sizing logs why."""
        for x in self._sharing():
            if x.sizes is None:
                try:
                    await self._async_sizes(x, loop)
                except Exception:  # noqa: PERF203 (its own _async_budget reports it)
                    log.debug("sizing %s for the shares failed", x.entry.id, exc_info=True)

    async def _async_size(self, m: AutoModel, loop: asyncio.AbstractEventLoop) -> None:
        own = m.budget_mb_override or 0  # (0 and None: the node's budget)
        sizes = await self._async_sizes(m, loop)
        node_mb = share = capped = None
        if own:
            budget_bytes = own * 2**20
        else:  # the node's budget (configured, else free memory plus what its chosen slices hold) is shared
            await self._async_needs(loop)
            if self.budget_mb:
                node_bytes = self.budget_mb * 2**20
            else:
                node_bytes = await loop.run_in_executor(None, default_budget_bytes)
                node_bytes += sum(self._held_bytes(x) for x in self._sharing())
            sharing = self._sharing()  # (after the awaits)
            if m not in sharing:
                sharing = [*sharing, m]  # removed meanwhile: sized as if it still shared
            needs = [whole_bytes(x.sizes) if x.sizes is not None else 0 for x in sharing]
            shares = water_fill(node_bytes, needs)
            budget_bytes = shares[sharing.index(m)]
            node_mb = node_bytes // 2**20
            # why: the whole model fits its share (capped at it), or an equal part of what the
            # `capped` ones left
            capped = sum(1 for need, got in zip(needs, shares, strict=True) if got >= need)
            share = "whole_model" if budget_bytes >= whole_bytes(sizes) else "even"
        if (m.budget_mb_override or 0) != own:
            # a new budget during the awaits (re-ticked, the slider moved while an untick's sizing read
            # free memory): its re-budget left m.budget None and woke the choice, which sizes it at the
            # new one. Written here, this stale figure stayed until the next change (review r42).
            return
        m.budget_mb = budget_bytes // 2**20
        m.budget = lc.layers_for_budget(budget_bytes, sizes.per_layer_bytes, sizes.kv_per_layer_bytes,
                                        sizes.head_bytes, n_layers=sizes.n_layers)
        log.info("DIAG: slice budget %s", kv(model=m.entry.id, budget_mb=m.budget_mb, share=share or "own",
                                             shared_by=None if m.budget_mb_override else len(self._sharing()),
                                             node_budget_mb=node_mb, capped=capped,
                                             whole_model_mb=whole_bytes(sizes) // 2**20,
                                             layers=m.budget.layers,
                                             with_head=m.budget.with_head, per_layer_bytes=sizes.per_layer_bytes,
                                             kv_per_layer_bytes=sizes.kv_per_layer_bytes,
                                             head_bytes=sizes.head_bytes))
