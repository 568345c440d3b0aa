"""Bounded shutdown: a stop step that does not end in time is logged with what it waits on, then
left behind, so a node always stops (a tray Quit, a SIGTERM from systemd or a bench).

A coroutine's own stack (`Task.get_stack`) shows one frame; `await_chain` follows `cr_await`
down to the innermost awaitable, which names the future the step is stuck on:
`node.node:stop:181 → node.api.server:stop:90 → …:shutdown:12 → <Future pending>`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from node import const
from node.errors import NodeError, ShuttingDown
from node.logs import kv

log = logging.getLogger(__name__)

_CHAIN_MAX = 24  # frames followed down one await chain


def await_chain(task: asyncio.Task[Any]) -> str:
    """Where a pending task waits: its coroutines outermost first, then the awaited object."""
    parts: list[str] = []
    obj: Any = task.get_coro()
    for _ in range(_CHAIN_MAX):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None) or getattr(obj, "ag_frame", None)
        if frame is None:
            break
        parts.append(f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}:{frame.f_lineno}")
        nxt = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None) or getattr(obj, "ag_await", None)
        if nxt is None:
            break
        obj = nxt
    if task.done():
        return "done"
    waiter = getattr(task, "_fut_waiter", None)  # the future itself (the chain ends at its iterator)
    if waiter is not None:
        parts.append(_short(waiter))
    return " → ".join(parts)


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 160 else text[:157] + "..."


def log_pending_tasks(reason: str, *, exclude: asyncio.Task[Any] | None = None) -> int:
    """One WARNING line per pending task on this loop with its await chain; returns how many."""
    tasks = [t for t in asyncio.all_tasks() if not t.done() and t is not exclude]
    for task in sorted(tasks, key=lambda t: t.get_name()):
        log.warning("DIAG: pending task %s", kv(reason=reason, task=task.get_name(), waits=await_chain(task)))
    return len(tasks)


async def async_bounded(step: str, aw: Awaitable[Any], timeout_s: float) -> bool:
    """Await one stop step for at most timeout_s. True when it ended (an error it raised is
    logged: a stop goes on). When it did not, it is logged with every pending task's await
    chain, cancelled and left behind (not awaited: a step that ignores its cancellation must not
    hold the stop either); False."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:  # the stop itself is cancelled: so is its step
        task.cancel()
        raise
    if done:
        if not task.cancelled() and task.exception() is not None:
            log.error("DIAG: stop step failed %s", kv(step=step, error=repr(task.exception())),
                      exc_info=task.exception())
        return True
    log.error("DIAG: stop step did not end %s", kv(step=step, waited_s=timeout_s, waits=await_chain(task)))
    log_pending_tasks(f"stop step {step} stuck", exclude=asyncio.current_task())
    task.cancel()
    task.add_done_callback(lambda t: _late(step, t))
    return False


def _late(step: str, task: asyncio.Task[Any]) -> None:
    """A step left behind ended after all: how (its error is retrieved here, under its name)."""
    error = None if task.cancelled() else task.exception()
    log.warning("DIAG: stop step ended late %s", kv(step=step, outcome="cancelled" if task.cancelled()
                                                    else "error" if error is not None else "ok",
                                                    error=repr(error) if error is not None else None))


def log_busy_threads(reason: str) -> int:
    """One WARNING line per live thread other than this one with its innermost frames; how many."""
    frames = sys._current_frames()
    me = threading.get_ident()
    count = 0
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        if thread.ident == me or frame is None:
            continue
        where = " ← ".join(f"{f.f_globals.get('__name__', '?')}:{f.f_code.co_name}:{f.f_lineno}"
                           for f in _frames(frame, 4))
        log.warning("DIAG: busy thread %s", kv(reason=reason, thread=thread.name, daemon=thread.daemon, at=where))
        count += 1
    return count


def _frames(frame: Any, n: int) -> list[Any]:
    out = []
    while frame is not None and len(out) < n:
        out.append(frame)
        frame = frame.f_back
    return out


def end_runs(runs: Any, error: NodeError, served: Any = None) -> int:
    """End the CompletionRuns under way (those of the model `served` only, when given), running or
    queued, with `error`: a generation stops at its next token and its client gets the error (the
    error event of its stream) rather than a reply that looks finished. Returns how many."""
    left = [run for run in list(runs) if not run.trace.done and (served is None or run.served is served)]
    for run in left:
        run.abort(error)
    return len(left)


async def async_drain_others(under_way: Callable[[], int]) -> None:
    """Node.stop's first step too, beside async_drain: the work this node runs for other nodes (its
    whole models' remote generations, the chain sessions on its slices; `under_way` counts them)
    gets the same NODE_DRAIN_S to finish, the node taking none new meanwhile. It was cut the moment
    the stop began, so another node's user saw an error mid-reply when no other node held those
    layers (a swarm test, 2026-12-06), while this node's own clients had their drain."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + const.NODE_DRAIN_S
    while under_way() and loop.time() < deadline:  # noqa: ASYNC110 (no change event to wait on)
        await asyncio.sleep(const.NODE_DRAIN_POLL_S)
    if left := under_way():
        log.warning("DIAG: stopping with work for other nodes under way, ending it %s",
                    kv(count=left, drain_s=const.NODE_DRAIN_S))


async def async_drain(traces: Any, runs: Any) -> None:
    """Node.stop's first step: requests under way (`traces`: the TraceHub) get `NODE_DRAIN_S` to
    finish; the `runs` (CompletionRuns) still going then end with a 503 `ShuttingDown` (the error
    event of their stream) instead of a connection cut mid-reply, which a client cannot tell from
    a reply the network lost (a swarm test, 2026-12-06: no error, no [DONE], "client went away")."""
    if await traces.async_idle(const.NODE_DRAIN_S):
        return
    left = end_runs(runs, ShuttingDown("the node is shutting down: the reply was cut short"))
    log.warning("DIAG: stopping with requests under way, ending them %s", kv(count=left, drain_s=const.NODE_DRAIN_S))
    if left:  # (embeddings under way are not ended: they have had their time, the API's stop cuts them)
        await traces.async_idle(const.NODE_DRAIN_S)


def stop_signals() -> list[signal.Signals]:
    """The signals that stop a node cleanly (`swarmllm run`, the tray app): SIGINT, SIGTERM, and
    SIGHUP (POSIX) unless it is ignored: a closed terminal or a dropped ssh
    session sends SIGHUP, whose default ended the node at once (no drain: streams cut without an
    error event, its last log lines lost); `nohup swarmllm run` ignores it and keeps ignoring it."""
    sigs = [signal.SIGINT, signal.SIGTERM]
    hup = getattr(signal, "SIGHUP", None)
    if hup is not None and signal.getsignal(hup) is not signal.SIG_IGN:
        sigs.append(hup)
    return sigs
