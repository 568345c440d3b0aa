"""A whole model's failed load, remembered with its file's identity.

A load that failed (an architecture llama.cpp does not know, a missing or corrupt tensor, a file
too big for memory) fails again on the same file: until 2026-12-06 every request that named the
model loaded it again (the SDKs' two retries of the 503: three loads, tens of seconds each for a big
file). Now the failure is kept with the file's size and mtime as the load found them, and requests
get its reason at once (`ModelLoadFailed`), until the file changes, LOAD_FAILURE_RETRY_S pass,
another model's weights are freed (memory that was short may not be now), or the user asks for a
load (admin API, the GUI). A model whose vocabulary could not be read is refused for good: no load
can succeed without one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from node import const
from node.errors import ModelLoadFailed

FileIdentity = tuple[int, int]  # (size in bytes, mtime in ns)


def file_identity(path: Path) -> FileIdentity | None:
    """The file's (size, mtime_ns), or None when it cannot be read (blocking: a stat)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


@dataclass
class LoadFailure:
    """Why a model's load failed, and which file it failed on."""

    reason: str
    file: FileIdentity | None  # as the load found it (stat before loading); None: unknown
    at: float  # time.time() of the failure
    vocabulary: bool = False  # its vocabulary could not be read: no load can succeed on this file
    since: float = field(default_factory=time.monotonic)
    memory_freed: bool = False  # another model's weights were freed since
    retry_said: bool = False  # the log said once that a request tries it again

    def lapsed(self, path: Path) -> str | None:
        """Why a request may load the model again, or None while the failure stands (blocking: a stat)."""
        if self.vocabulary:
            return None
        if self.memory_freed:
            return "another model's weights were freed since"
        if time.monotonic() - self.since >= const.LOAD_FAILURE_RETRY_S:
            return f"it failed over {const.LOAD_FAILURE_RETRY_S:.0f} s ago"
        now = file_identity(path)
        if self.file is None or now != self.file:
            return "its file changed since"
        return None

    def error(self, model_id: str) -> ModelLoadFailed:
        """What a request for the model is told."""
        if self.vocabulary:
            return ModelLoadFailed(f"model {model_id} cannot be served: {self.reason}. Without its vocabulary "
                                   "no load can succeed; replace the file with a whole, supported copy")
        return ModelLoadFailed(f"model {model_id} failed to load: {self.reason}. It is not loaded again "
                               "for requests until its file changes or a few minutes pass; load it from the "
                               "admin API or the app's Models tab to try again")
