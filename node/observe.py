"""One observer helper for every event source of the node (traces, models, downloads, peers).

Each source owns an `Observers` and exposes `subscribe(callback) -> unsubscribe`; it calls
`emit(...)` on the loop. An observer that raises is logged and never breaks the source (a GUI bug
must not fail a request or drop a link); observers must not block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

log = logging.getLogger(__name__)

P = ParamSpec("P")


class Observers(Generic[P]):
    """The callbacks of one event source, called in subscription order."""

    __slots__ = ("_callbacks", "_what")

    def __init__(self, what: str) -> None:
        self._what = what  # named in the log line when an observer fails
        self._callbacks: list[Callable[P, None]] = []

    def subscribe(self, callback: Callable[P, None]) -> Callable[[], None]:
        """Call `callback` on every event; returns a function that unsubscribes it (idempotent)."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every observer; one that raises is logged and the others still run."""
        for callback in list(self._callbacks):
            try:
                callback(*args, **kwargs)
            except Exception:
                log.exception("%s observer %r failed", self._what, callback)

    def __len__(self) -> int:
        return len(self._callbacks)
