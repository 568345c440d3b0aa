"""The move protocol of `--serve auto` (a mixin of autoserve.AutoServe, which decides the moves):
load the new range while the old one serves (or, without memory for both, drop the old one first),
commit only if every layer of the old range keeps a holder and none falls below the floor, drain
the old range and free it once its sessions end; a slice loaded for a choice that no longer
stands is given up."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from node import const
from node.inference.pipeline import layerchoice as lc
from node.inference.pipeline.budgets import AutoModel
from node.inference.pipeline.coverage import ModelCoverage, coverage_text, default_budget_bytes
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.hosted import HostedSlice
from node.logs import kv

log = logging.getLogger("node.inference.pipeline.autoserve")  # the layer choice's lines, one logger


class Moves:
    """Moves for AutoServe (which provides these attributes and the methods named below)."""

    node_id: str
    host: SliceHost
    _drains: set[asyncio.Task]
    announce: Any
    note: Any
    coverage: Any
    _log: Any
    _async_load: Any
    _loaded: Any
    _wanted: Any

    async def _async_move(self, m: AutoModel, old: HostedSlice, d: lc.Decision, cov: ModelCoverage, why: str) -> None:
        entry, n = m.entry, m.entry.n_layers
        others = [s for s in cov.spans if s.node_id != self.node_id]
        before = coverage_text(n, cov.spans)
        self._log(m, d.range_text, before, coverage_text(n, [*others, lc.Span(self.node_id, d.start, d.end)]),
                  f"{why}:move_from_{old.start}-{old.end - 1}:{d.reason.replace(' ', '_')}")
        if not await self._async_room_for_both(m, d):
            await self._async_move_dropping_first(m, old, d)
            return
        new = await self._async_load(m, d)
        self._loaded(m, new)
        if new is None or new.state != "loaded" or not self._wanted(m):
            if new is not None:
                await self._async_give_up(new)
            return
        # commit: the swarm may have changed while we loaded; dropping the old range must leave
        # every one of its layers a holder (our new range counts), and no layer below the
        # swarm's floor of holders (another move, decided on another snapshot, may have thinned it)
        cov = self.coverage().get(entry.sha256) or cov
        bare = self._bare_without(cov, old, n)
        held = [*cov.spans, *([] if any(s.node_id == self.node_id and (s.start, s.end) == (d.start, d.end)
                                        for s in cov.spans) else [lc.Span(self.node_id, d.start, d.end)])]
        thin = [] if bare else lc.thinned_by_drop(n, held, self.node_id, old.start, old.end)
        if bare or thin:
            what = (f"layers_{bare[0]}-{bare[-1]}_would_have_no_holder" if bare
                    else f"layers_{thin[0]}-{thin[-1]}_would_fall_below_the_floor")
            self._log(m, f"{old.start}-{old.end - 1}", coverage_text(n, cov.spans), coverage_text(n, cov.spans),
                      f"move_aborted:{what}")
            await self._async_give_up(new)
            await self.announce()
            return
        self.host.drain(old)
        self.note(f"moved to layers {d.range_text} of {entry.id} (from {old.start}-{old.end - 1})")
        await self.announce()
        task = asyncio.create_task(self._async_free(old), name="autoserve-drain")
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    def _bare_without(self, cov: ModelCoverage, old: HostedSlice, n: int) -> list[int]:
        """The layers of `old` that would have no holder if this node dropped it."""
        keep = [s for s in cov.spans if not (s.node_id == self.node_id and (s.start, s.end) == (old.start, old.end))]
        counts = lc.layer_counts(n, keep)
        return [layer for layer in range(old.start, old.end) if counts[layer] == 0]

    async def _async_room_for_both(self, m: AutoModel, d: lc.Decision) -> bool:
        """Whether the machine has memory for the new range while the old one is still loaded
        (available memory now, less the headroom, against the new range's weights and KV)."""
        if m.sizes is None:
            return False
        need = (d.end - d.start) * (m.sizes.per_layer_bytes + m.sizes.kv_per_layer_bytes)
        if d.end == m.entry.n_layers:
            need += m.sizes.head_bytes
        return await asyncio.get_running_loop().run_in_executor(None, default_budget_bytes) >= need

    async def _async_move_dropping_first(self, m: AutoModel, old: HostedSlice, d: lc.Decision) -> None:
        """A move without room for both ranges: stop advertising the old one (it is dropped only if
        every one of its layers keeps another holder), let its sessions end, free it, then load the
        new one. Never twice the memory; the node serves no new chain while it loads."""
        entry, n = m.entry, m.entry.n_layers
        cov = self.coverage().get(entry.sha256) or ModelCoverage(entry.sha256, entry.name, n)
        bare = self._bare_without(cov, old, n)
        if bare:
            self._log(m, f"{old.start}-{old.end - 1}", coverage_text(n, cov.spans), coverage_text(n, cov.spans),
                      f"move_aborted:layers_{bare[0]}-{bare[-1]}_would_have_no_holder")
            return
        log.info("DIAG: no memory for both ranges during the move; dropping the old one first %s", kv(
            model=entry.id, old=f"{old.start}-{old.end - 1}", new=d.range_text))
        self.host.drain(old)
        await self.announce()
        await self._async_free(old)
        new = await self._async_load(m, d)
        self._loaded(m, new)
        if new is None:
            pass  # cancelled (removed, paused)
        elif new.state != "loaded" or not self._wanted(m):
            await self._async_give_up(new)  # the next evaluation chooses afresh (this node holds nothing)
        else:
            self.note(f"moved to layers {d.range_text} of {entry.id} (from {old.start}-{old.end - 1}, dropped first)")
        await self.announce()

    async def _async_give_up(self, hosted: HostedSlice) -> None:
        """A slice loaded for a choice that no longer stands: unloaded now, or, when it runs sessions
        (a draining slice kept by SliceHost.async_load for the same range), drained and freed once
        they end, as any drained slice is."""
        if hosted.model is not None and hosted.model.sessions.counts()[0]:
            self.host.drain(hosted)
            task = asyncio.create_task(self._async_free(hosted), name="autoserve-give-up")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
            return
        await self.host.async_unload(hosted, keep_parts=hosted.state == "failed")  # (a retry goes on from its parts)

    async def _async_free(self, old: HostedSlice, *, keep_parts: bool = False) -> None:
        """Free a drained slice once no session uses it, or after the grace period."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + const.AUTO_SERVE_DRAIN_S
        # the session store has no change event; a session ends by SESSION_END, CANCEL or the sweeper
        while old.state == "draining" and old.model is not None and old.model.sessions.counts()[0] \
                and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(const.AUTO_SERVE_DRAIN_POLL_S)
        if old.state != "draining":
            return  # chosen again while it drained (host.async_load kept it): it serves on
        await self.host.async_unload(old, keep_parts=keep_parts)
