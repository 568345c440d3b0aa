"""AutoServe's controls (its part): models added, given a new budget, unticked, retried, repointed
to another file of their bytes and removed while running (the desktop app's "Help serve", the admin
API, a `--model URL` opened late), and the pause. The chooser itself is autoserve.py."""

from __future__ import annotations

import asyncio
from typing import Any

from node.inference.pipeline.budgets import AutoModel
from node.models.catalog import ModelEntry


class ChoiceControls:
    """Mixed into AutoServe: needs its models, paused flag, wake event and reason, and (from it and
    BudgetShares) _sharing, _async_reshare, _set_failure, _async_release, _wanted."""

    models: list[AutoModel]
    paused: bool
    _why: str
    _wake: asyncio.Event
    _sharing: Any
    _async_reshare: Any
    _set_failure: Any
    _async_release: Any
    _wanted: Any

    def model(self, sha256: str) -> AutoModel | None:
        return next((m for m in self.models if m.entry.sha256 == sha256), None)

    async def async_add(self, entry: ModelEntry, budget_mb: int = 0, *, given: bool = False) -> None:
        """Choose layers of `entry` too, within `budget_mb` (0: the node's budget). A new budget for
        a model already chosen frees its slice and chooses again (a smaller budget must shrink it).
        `given`: a `--serve auto` model opened after start (a `--model URL` whose origin answered
        late), which an untick of "Help serve" keeps chosen as it does one given at start."""
        m = self.model(entry.sha256)
        if m is not None and given:
            m.given = True
        if m is not None and m.budget_mb_override == budget_mb:
            if m.last_failure is not None:  # the same budget again: a failed choice is tried again now
                self.retry(entry.sha256)
            return
        if m is None:
            sharing = len(self._sharing())
            m = AutoModel(entry, int(entry.sha256[:8], 16), at_start=False, given=given)
            self.models.append(m)
            m.budget_mb_override, m.budget, m.settled = budget_mb, None, False
            if len(self._sharing()) != sharing:
                await self._async_reshare()
            self._why = "added"
            self._wake.set()
        else:
            await self._async_rebudget(m, budget_mb)

    async def _async_rebudget(self, m: AutoModel, budget_mb: int | None) -> None:
        """`m` chosen again within `budget_mb` (None: the node's budget): its slices freed once idle
        (their parts kept), its last failure over."""
        sharing = len(self._sharing())
        # (before the release's awaits: an evaluation meanwhile sees no budget and loads nothing)
        m.budget_mb_override, m.budget, m.settled = budget_mb, None, False
        m.failures = 0
        self._set_failure(m, None)  # a new budget is a new choice: the old one's failure is over
        await self._async_release(m, keep_parts=True)
        if len(self._sharing()) != sharing:
            await self._async_reshare()
        self._why = "added"
        self._wake.set()

    async def async_end_help(self, sha256: str) -> None:
        """Its "Help serve" row is gone (unticked): a model given at start (`--serve auto`) goes back
        to the node's budget and is chosen again; one added while running stops being served. The
        untick removed a `--serve auto` model from the choice until a restart (2026-12-07), and one
        opened after start (a `--model URL` whose origin answered late) still (review r42)."""
        m = self.model(sha256)
        if m is None or not m.given:
            await self.async_remove(sha256)
        elif m.budget_mb_override:  # a cap of its own: chosen again at the node's budget
            await self._async_rebudget(m, None)
        else:  # ticked at 0 ("free memory"): the node's budget already, its slice serves on (review r42:
            m.budget_mb_override = None  # it was freed and loaded again)

    def retry(self, sha256: str) -> None:
        """Choose again now for a model whose last load failed: its file was added again or helped
        again (a file that changed on disk may hold its bytes again; review r32: nothing but a new
        budget, a pause or a restart did)."""
        m = self.model(sha256)
        if m is not None and m.last_failure is not None and self._wanted(m):
            m.failures = 0
            self._why = "retry"
            self._wake.set()

    def repoint(self, m: AutoModel, entry: ModelEntry) -> None:
        """The choice `m` goes on from `entry`, another file of its bytes (its own file went, or its
        Help-serve row): a budget that could not be sized from the file gone is sized again from it
        (the error stuck, and nothing of the model was chosen again, when a sizing ran between the
        deletion and the watch's look)."""
        m.entry = entry
        if m.budget_error is not None:
            m.budget, m.budget_error = None, None
            self._why = "added"
            self._wake.set()

    async def async_remove(self, sha256: str) -> None:
        """Stop serving `sha256`: its slices stop being advertised and are freed once idle."""
        m = self.model(sha256)
        if m is None:
            return
        sharing = len(self._sharing())
        self.models.remove(m)
        self._set_failure(m, None)
        await self._async_release(m)
        if len(self._sharing()) != sharing:
            await self._async_reshare()
            self._why = "removed"
            self._wake.set()

    async def async_pause(self) -> None:
        """Choose nothing and free every chosen slice (each after its sessions end, or the drain
        grace period)."""
        self.paused = True
        for m in list(self.models):
            self._set_failure(m, None)  # (nothing is chosen while paused: no failure is pending)
            await self._async_release(m, keep_parts=True)

    def resume(self) -> None:
        self.paused = False
        self._why = "resumed"
        self._wake.set()
