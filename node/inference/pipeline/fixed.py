"""The `--layers A-B` slices a node is told to serve (not chosen by `--serve auto`): loaded at
start, and one whose layers could not be fetched then (a `--model URL` origin that was down longer
than a fetch's retries) loaded again later, in the background."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from node import const
from node.errors import NodeError
from node.inference.pipeline.host import SliceHost
from node.logs import kv
from node.models.catalog import ModelEntry
from node.models.partial import parts_for

log = logging.getLogger(__name__)

Slice = tuple[ModelEntry, int, int]


async def async_load_at_start(host: SliceHost, slices: list[Slice], note: Callable[[str], None]) -> list[Slice]:
    """Load each slice; returns those to load again later (their layers could not be fetched)."""
    later = []
    for entry, start, end in slices:
        hosted = await host.async_load(entry, start, end)
        if hosted.state == "loaded":
            note(f"serving layers {start}-{end - 1} of {entry.id}")
            # parts of another range, held from an earlier run with other --layers, go (as an
            # automatic move's do): else each new range left the old one on disk
            await host.async_trim_parts(entry)
        else:
            note(f"layers {start}-{end - 1} of {entry.id} failed to load: {hosted.error}")
            if _missing(entry, start, end) or hosted.touched:  # not fetched (the origin went), or touched: later
                later.append((entry, start, end))
            elif entry.partial is not None:
                _not_again(entry, start, end, hosted.error)
    return later


async def async_load_later(host: SliceHost, entry: ModelEntry, start: int, end: int, *,
                           note: Callable[[str], None], announce: Callable[[], Awaitable[None]],
                           paused: Callable[[], bool], stopping: Callable[[], bool]) -> None:
    """A slice that failed at start (its layers not fetched, or its file touched at every try: review r40),
    loaded again after PARTIAL_OPEN_RETRY_MIN_S, doubling up to
    PARTIAL_OPEN_RETRY_MAX_S, until it loads (it stayed failed until a restart). Left alone while
    contributing is `paused` (a resume loads it)."""
    delay = const.PARTIAL_OPEN_RETRY_MIN_S
    while not stopping():
        await asyncio.sleep(delay)
        delay = min(delay * 2, const.PARTIAL_OPEN_RETRY_MAX_S)
        held = host.slices.get((entry.sha256, start, end))
        if held is not None and held.state != "failed":
            return  # loaded or loading another way (a resume)
        if paused():
            continue
        if not _missing(entry, start, end) and not (held is not None and held.touched):
            # every layer is here and its file was not touched as it loaded: what failed stays
            _not_again(entry, start, end, held.error if held else None)
            return
        log.info("DIAG: loading layers that failed at start again %s",
                 kv(model=entry.id, layers=f"{start}-{end - 1}", error=held.error if held else None))
        hosted = await host.async_load(entry, start, end)
        if hosted.state == "loaded":
            note(f"serving layers {start}-{end - 1} of {entry.id}")
            await host.async_trim_parts(entry)  # as at start: another range's parts go
            await announce()
            return


def _missing(entry: ModelEntry, start: int, end: int) -> bool:
    """Whether a part that layers [start, end) of a partial model read is not on disk (a fetch to
    retry): its layers, and `globals`, `embd` and `head` as the range needs them."""
    if entry.partial is None:
        return False
    try:
        return not entry.partial.covers(parts_for(entry.header, start, end))
    except NodeError:  # a range outside the model: nothing a fetch could bring
        return False


def _not_again(entry: ModelEntry, start: int, end: int, error: str | None) -> None:
    log.info("DIAG: layers that failed at start are all here; not loading them again %s",
             kv(model=entry.id, layers=f"{start}-{end - 1}", error=error))
