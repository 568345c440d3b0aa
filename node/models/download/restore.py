"""Downloads an earlier run left unfinished, found again at start (2026-12-06).

A node stopped mid-download (the app quit, a laptop closed, a crash) leaves `models/<name>.gguf.part`
and its sidecar `<name>.gguf.part.json` (partfile.py: the URL without its query, the validator).
Until 2026-12-06 nothing listed them after a restart: the user had to know to paste the same URL
again. Now each `.part` with a readable sidecar is a paused job again (its URL from the sidecar,
`done_bytes` the bytes on disk), a split set's parts one job; Resume fetches from there with Range
and If-Range, Cancel deletes the files. A `.part` without a sidecar cannot be resumed (nothing says
where it came from or which version it is): it is said in the log, not listed; so is one whose
sidecar's URL is not valid (2026-12-06: it stopped the node from starting).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from node.errors import NodeError
from node.models.file_kinds import llama_split_name, split_part
from node.values import is_int

from .job import DownloadJob
from .partfile import sidecar, size_or_zero
from .sets import set_parts
from .urls import display_url, resolve_url

PART = ".part"


@dataclass(frozen=True)
class Kept:
    """A `.part` file of an earlier run and what its sidecar says."""

    name: str  # its file name in models/ once complete (without `.part`)
    url: str  # without the query string
    signed: bool  # the URL had a query string, not kept on disk (a signed URL's signature)
    size: int
    job_id: str | None = None  # the download's id in the run that wrote the sidecar (it is kept)
    total: int | None = None  # the file's size as its server announced it (sidecars since 2026-12-07)
    sha256: str | None = None  # the hash the user gave for it, checked when it completes (idem)
    named_url: str | None = None  # a split set's part: the URL of the part the user named (idem)
    named_sha256: str | None = None  # and the hash the user gave for that part


def _valid_url(url: object) -> bool:
    """Whether a sidecar's URL is one a download can fetch (an edited or damaged sidecar's, such as
    `https://example.com:99999/a.gguf` or `https://[::1/b.gguf`, raised up through Node.start)."""
    if not isinstance(url, str) or not url:
        return False
    try:
        display_url(resolve_url(url))
    except (NodeError, ValueError):
        return False
    return True


def _sha256(value: object) -> str | None:
    return value.lower() if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value) else None


def find_kept(models_dir: Path) -> tuple[list[Kept], list[tuple[str, int, str]]]:
    """(the `.part` files with a readable sidecar, the others as (file name, bytes, why)). Blocking."""
    kept: list[Kept] = []
    orphans: list[tuple[str, int, str]] = []
    for part in _files(models_dir, f"*.gguf{PART}"):
        size = size_or_zero(part)
        try:
            meta = json.loads(sidecar(part).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = None
        url = meta.get("url") if isinstance(meta, dict) else None
        if not _valid_url(url):
            orphans.append((part.name, size, "no sidecar" if meta is None else "its sidecar has no valid URL"))
            continue
        job_id = meta.get("job")
        job_id = job_id if isinstance(job_id, str) and re.fullmatch(r"[0-9a-f]{12}", job_id) else None
        total = meta.get("total")
        total = total if is_int(total) and total >= size else None
        named_url = meta.get("named_url") if _valid_url(meta.get("named_url")) else None
        kept.append(Kept(part.name[:-len(PART)], url, bool(meta.get("signed")), size, job_id, total,
                         _sha256(meta.get("sha256")), named_url, _sha256(meta.get("named_sha256"))))
    return kept, orphans


def _files(models_dir: Path, pattern: str) -> list[Path]:
    """The files of models/ matching `pattern`, sorted (none when there is no models/ yet; blocking)."""
    try:
        return sorted(p for p in models_dir.glob(pattern) if p.is_file())
    except OSError:
        return []


def finish_linked_landings(models_dir: Path) -> list[str]:
    """Landings a crash cut between a `.part`'s hard link into models/ and its delete (`partfile._place`),
    seen as a `.part` that is the very file at its target (blocking; the names acted on): a file, a
    split set's part 1 (which lands last) or a part fetched alone has landed, checked: its `.part` and
    sidecar are deleted; a later part of a set whose part 1 is still a `.part` gets its `.part` back
    alone (the set lands again when resumed, `partfile.cut_landing`). Until 2026-12-07 the next start
    listed a paused download beside the model served from the file, and its Resume said "already
    exists"."""
    done = []
    for part in _files(models_dir, f"*.gguf{PART}"):
        target = part.with_name(part.name[:-len(PART)])
        try:
            if not (target.exists() and os.path.samefile(part, target)):
                continue
            split = split_part(target)
            first = None if split is None else models_dir / (llama_split_name(split[0], 1, split[2]) + PART)
            if first is not None and split[1] != 1 and first.exists():  # a set landing, part 1 still to come
                target.unlink()
            else:  # a file, a set's part 1, or a part downloaded alone (review r74: its target was removed)
                part.unlink()
                sidecar(part).unlink(missing_ok=True)
        except OSError:  # (read-only, or gone meanwhile: left as it is)
            continue
        done.append(part.name)
    return done


def stale_sidecars(models_dir: Path) -> list[Path]:
    """Sidecars whose download is over (blocking): their `.part` gone and their file landed (a crash
    between `land()`'s rename and its delete of the sidecar; of a split set, once part 1, which lands
    last, is there), or neither there (a crash before the `.part` was made). A part of a set whose
    part 1 is not there yet keeps its sidecar: it marks a landing to finish (`partfile.cut_landing`)."""
    stale = []
    for side in _files(models_dir, f"*.gguf{PART}.json"):
        part = side.with_name(side.name[:-len(".json")])
        target = part.with_name(part.name[:-len(PART)])
        if part.exists():
            continue
        split = split_part(target)
        landed = target.exists() and (split is None or (models_dir / llama_split_name(split[0], 1, split[2])).exists())
        if landed or not target.exists():
            stale.append(side)
    return stale


def remove_stale_sidecars(models_dir: Path) -> list[str]:
    """Delete stale_sidecars(); the names of those deleted (blocking)."""
    removed = []
    for side in stale_sidecars(models_dir):
        try:
            side.unlink(missing_ok=True)
        except OSError:  # (read-only: it stays, as before, and is still never a job)
            continue
        removed.append(side.name)
    return removed


def _one_job(k: Kept) -> DownloadJob:
    return _job(k.url, k.name, k.size, k.signed, k.job_id, total_bytes=k.total, part_bytes=[k.total], sha256=k.sha256)


def _job(url: str, file_name: str, size: int, signed: bool, job_id: str | None, **more) -> DownloadJob:
    """A paused job; its id the sidecar's when it has one (what `swarmllm download` said to resume);
    its size and hash the sidecar's too (an older sidecar has neither: unknown, none)."""
    job_id = job_id or hashlib.sha256(f"restored\0{file_name}\0{time.time_ns()}".encode()).hexdigest()[:12]
    return DownloadJob(job_id, url, file_name, state="paused", done_bytes=size, error="paused",
                       finished_at=time.time(), restored=True, signed=signed, **more)


def _set_job(members: list[Kept]) -> DownloadJob | None:
    """One job for a split set's kept parts, when the sidecar's URL rebuilds that set; else None. The
    set is rebuilt from the named part's URL (`named_url`, sidecars since 2026-12-07; else part 1's):
    the job's URL, what resume() starts, so the hash given is checked against that part again."""
    members = sorted(members, key=lambda k: split_part(Path(k.name))[1])
    first = split_part(Path(members[0].name))
    first_name = llama_split_name(first[0], 1, first[2])
    given = next((k for k in members if k.named_url), None)
    try:
        plan = set_parts(resolve_url(given.named_url if given else members[0].url), first_name, first_name)
    except NodeError:
        return None
    names = {n.lower() for _u, n in plan.parts}
    if len(plan.parts) != first[2] or any(k.name.lower() not in names for k in members):
        return None
    by_name = {k.name.lower(): k for k in members}
    part_bytes = [by_name[n.lower()].total if n.lower() in by_name else None for _u, n in plan.parts]
    known = [b for b in part_bytes if b is not None]
    named = by_name.get(plan.parts[plan.named][1].lower())  # the part the hash is of (an older sidecar's)
    sha256 = given.named_sha256 if given else named.sha256 if named else None
    return _job(plan.parts[plan.named][0], plan.parts[0][1], sum(k.size for k in members), any(k.signed for k in members),
                # the latest job's id: parts are fetched in order, and a job going on past a complete part
                # (the origin's 416) leaves that part's sidecar as an earlier job wrote it (found in review)
                next((k.job_id for k in reversed(members) if k.job_id), None), parts=plan.parts, named=plan.named,
                part_bytes=part_bytes, total_bytes=sum(known) if len(known) == len(part_bytes) else None,
                sha256=sha256)


def restored_jobs(kept: list[Kept], taken: set[str] = frozenset()) -> list[DownloadJob]:
    """Paused jobs for the kept `.part` files: one per file, one per split set (the parts of a set
    are named `prefix-0000N-of-0000M.gguf`; one of them kept is enough to list the set). A job keeps
    its sidecar's id unless `taken` or another kept file's has it (then a new one)."""
    jobs = _restored_jobs(kept)
    seen = set(taken)
    for job in jobs:
        if job.id in seen:
            job.id = hashlib.sha256(f"restored\0{job.file_name}\0{time.time_ns()}".encode()).hexdigest()[:12]
        seen.add(job.id)
    return jobs


def _restored_jobs(kept: list[Kept]) -> list[DownloadJob]:
    jobs: list[DownloadJob] = []
    sets: dict[tuple[str, int], list[Kept]] = {}
    for k in kept:
        part = split_part(Path(k.name))
        if part is None:
            jobs.append(_one_job(k))
        else:
            sets.setdefault((part[0].lower(), part[2]), []).append(k)
    for members in sets.values():
        job = _set_job(members)
        if job is not None:
            jobs.append(job)
        else:  # its URL is not a set's (a part downloaded under another name): each part alone
            jobs += [_one_job(k) for k in members]
    return jobs
