"""A whole model's failed load, remembered with its file's identity.

A load that failed (an architecture llama.cpp does not know, a missing or corrupt tensor, a file
too big for memory) fails again on the same file: until 2026-12-06 every request that named the
model loaded it again (the SDKs' two retries of the 503: three loads, tens of seconds each for a big
file). Now the failure is kept with the file's size and mtime and requests get its reason at once
(`ModelLoadFailed`), until the file changes or the user asks for a load (admin API, the GUI).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from node.errors import ModelLoadFailed

FileIdentity = tuple[int, int]  # (size in bytes, mtime in ns)


def file_identity(path: Path) -> FileIdentity | None:
    """The file's (size, mtime_ns), or None when it cannot be read (blocking: a stat)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class LoadFailure:
    """Why a model's load failed, and which file it failed on."""

    reason: str
    file: FileIdentity | None
    at: float  # time.time() of the failure

    @classmethod
    def now(cls, reason: str, path: Path) -> LoadFailure:
        """A failure of the file at `path` as it is now (blocking: a stat)."""
        return cls(reason, file_identity(path), time.time())

    def stands(self, path: Path) -> bool:
        """True while the file is the one that failed (blocking: a stat)."""
        return self.file is not None and file_identity(path) == self.file

    def error(self, model_id: str) -> ModelLoadFailed:
        """What a request for the model is told."""
        return ModelLoadFailed(f"model {model_id} failed to load: {self.reason}. It is not loaded again "
                               "for requests until its file changes; load it from the admin API or the "
                               "app's Models tab to try again")
