"""A download as the API, the CLI and the GUI see it."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .urls import display_url


@dataclass
class DownloadJob:
    """One download, as the API, the CLI and the GUI see it."""

    id: str
    url: str  # resolved; never shown whole (display_url)
    file_name: str
    sha256: str | None = None
    linked_sha256: str | None = None  # the whole file's sha256 as the Hub states it (X-Linked-Etag)
    state: str = "starting"  # starting | downloading | verifying | done | failed | cancelled | paused
    total_bytes: int | None = None
    done_bytes: int = 0
    attempts: int = 0
    resumed_from: int = 0  # bytes kept from an earlier attempt (Range)
    # bytes this job received from the origin, a restart's thrown away too: its rate's (2026-12-07: the
    # rate was (done_bytes - resumed_from) / time, negative after a resume restarted from zero)
    fetched_bytes: int = 0
    error: str | None = None
    model_id: str | None = None
    user_cancelled: bool = False
    user_paused: bool = False  # stopped keeping its .part: resume() goes on from there
    stop: threading.Event = field(default_factory=threading.Event, repr=False)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # a split model (sets.py): every part's (URL, file name), part 1 first; `file_name` is part 1's,
    # `url` the part named, `parts[named]` (whose file `sha256` is); done/total_bytes count the whole set
    parts: list[tuple[str, str]] = field(default_factory=list)
    named: int = 0
    # one part's fetch of a split set (runner._async_part): the named part's URL and the user's sha256
    # of it, which every part's sidecar keeps (restore.py rebuilds the set from that URL)
    set_named: tuple[str, str | None] | None = None
    # a split part fetched alone (a per-object signed URL): the set's other parts (URL without the
    # query, file name); `note` says which are still missing once it is done
    others: list[tuple[str, str]] = field(default_factory=list)
    note: str | None = None
    landing: bool = False  # every part checked, moving into models/: too late to pause or cancel
    part: int = 1  # the part being fetched (1-based)
    part_bytes: list[int | None] = field(default_factory=list)  # each part's size, when known
    # an earlier run's download found at start (restore.py): its URL is the sidecar's, without the
    # query string; `signed`: the URL had one (a 401/403 then says to paste the link again)
    restored: bool = False
    signed: bool = False
    kept_bytes: int = 0  # a failed download's partial files left on disk: resume() goes on from them
    resumed_as: str | None = None  # resume() made this download: it goes on there (this one is done with)

    def __post_init__(self) -> None:
        if not self.parts:
            self.parts = [(self.url, self.file_name)]
        self.part_bytes = self.part_bytes or [None] * len(self.parts)

    @property
    def active(self) -> bool:
        return self.state in ("starting", "downloading", "verifying")

    @property
    def resumable(self) -> bool:
        """Paused, or failed with its partial file kept: resume() goes on from the bytes on disk."""
        return self.resumed_as is None and (self.state == "paused" or (self.state == "failed" and self.kept_bytes > 0))

    def summary(self) -> dict[str, Any]:
        elapsed = (self.finished_at or time.time()) - self.started_at
        fetched = self.fetched_bytes
        return {
            "id": self.id, "url": display_url(self.url), "file": self.file_name, "state": self.state,
            "total_bytes": self.total_bytes, "done_bytes": self.done_bytes,
            "progress": round(self.done_bytes / self.total_bytes, 4) if self.total_bytes else None,
            "mb_per_s": round(fetched / 1e6 / elapsed, 2) if elapsed > 0 else None,
            "attempts": self.attempts, "error": self.error, "model_id": self.model_id,
            "parts": len(self.parts), "part": self.part, "note": self.note,
            "resumable": self.resumable, "restored": self.restored, "kept_bytes": self.kept_bytes,
            "resumed_as": self.resumed_as, "resumed_from": self.resumed_from,
        }
