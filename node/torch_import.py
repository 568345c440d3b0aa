"""torch imported on first need (blocking: run it in an executor), with its objects kept out of the
garbage collector's full passes.

The start freezes the objects it made (`gc.freeze()`, commands/run.py, the tray app): a full pass over
them stalled the loop. torch's ~140,000 long-lived objects come later now (a node imports it only when
it needs it, node.inference.torchload): frozen at its first import, whichever needed it first (a slice
load, the slice sizes a layer choice or the app's layer slider reads, the GPU probe). 2026-12-07,
review r73: only a slice load froze them, so a node that sized a model first kept them in reach, and
each full pass took 150 ms of the loop."""

from __future__ import annotations

import gc
import threading
from types import ModuleType

_frozen: set[str] = set()
_lock = threading.Lock()


def freeze_once(what: str) -> None:
    """gc.freeze() the first time `what` (a group of modules just imported) is said (blocking, instant)."""
    with _lock:
        if what in _frozen:
            return
        _frozen.add(what)
    # the young generations' garbage first (cheap): a request's cycle live at this moment, the
    # freeze coming from an executor mid-request, would otherwise never be collected (review r75)
    gc.collect(1)
    gc.freeze()


def import_torch() -> ModuleType:
    """torch (blocking: 1.5 s the first time; an ImportError where it is missing or broken)."""
    import torch

    freeze_once("torch")
    return torch
