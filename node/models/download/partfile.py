"""The `.part` file of a download and its sidecar: what a later attempt may resume, and how.

`models/<name>.gguf.part` holds the bytes so far; `<name>.gguf.part.json` the URL (without its
query) and the server's validator (a strong ETag, else Last-Modified), which the next attempt sends
as `If-Range` so it resumes only the same version of the same file. Blocking: call these on the
download's own I/O thread.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from pathlib import Path

from .urls import display_url, signed_query


def size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def sidecar(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def discard_part(part: Path) -> None:
    part.unlink(missing_ok=True)
    sidecar(part).unlink(missing_ok=True)


# os.link's errors on a file system without hard links (FAT, exFAT, some network shares)
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK, errno.EXDEV}


def land(parts: list[Path], targets: list[Path]) -> None:
    """Every checked part into models/, part 1 (the one the folder lists) last, and their sidecars
    gone: one executor job, so that nothing stops it half-way (runner._async_to_the_end). Never over
    a file put at a target while the download ran (2026-12-07, review r65: os.replace overwrote a
    copy the user had made meanwhile): FileExistsError naming it, every part still its `.part`."""
    placed: list[tuple[Path, Path]] = []
    try:
        for part, target in reversed(list(zip(parts, targets, strict=True))):
            _place(part, target)
            placed.append((part, target))
    except FileExistsError:
        for part, target in reversed(placed):  # a set's parts landed before it: back to their .part
            os.replace(target, part)
        raise
    for part in parts:
        sidecar(part).unlink(missing_ok=True)


def _place(part: Path, target: Path) -> None:
    """Move `part` to `target` unless something is there (FileExistsError): a hard link then the
    part's unlink (the check and the move are one step); where the file system has no hard links, a
    check then a rename (only another program's write between the two is not seen)."""
    try:
        os.link(part, target)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "a file is there already", str(target)) from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "a file is there already", str(target)) from None
        os.replace(part, target)
        return
    part.unlink()


def cut_landing(part: Path, target: Path) -> bool:
    """Whether `target` is a part that an earlier run's landing moved into models/ and then died (a
    crash or kill -9 between land()'s renames): its `.part` is gone and its sidecar, which land()
    removes only after every rename, is still there. A part fetched alone and landed has none."""
    return target.exists() and not part.exists() and sidecar(part).exists()


def reclaim_cut_landing(parts: list[Path], targets: list[Path]) -> list[Path]:
    """The parts of a set whose landing was cut short moved back to their `.part` (the download
    resumes them: complete, they are only checked again); the targets moved."""
    moved = []
    for part, target in zip(parts, targets, strict=True):
        if cut_landing(part, target):
            os.replace(target, part)
            moved.append(target)
    return moved


def write_sidecar(part: Path, url: str, validator: str | None, job_id: str | None = None, *,
                  total: int | None = None, sha256: str | None = None,
                  named: tuple[str, str | None] | None = None) -> None:
    # the URL without its query: no credentials on disk, and a fresh signed URL of the same file
    # still resumes (If-Range guards the version); `signed`: it had one, so a node started again
    # (restore.py) may find the bare URL refused, and says to paste the link again; `job`: the
    # download's id, which the job restored at the next start keeps (`swarmllm download --resume ID`);
    # `total`: the file's size as the server announced it, `sha256`: the hash the user gave for it
    # (2026-12-07: a restored job had no size until resumed, and its resume no longer checked the hash);
    # `named_url`, `named_sha256`: a split set's part, the part the user's URL named and the hash given
    # for it, in every part's sidecar (2026-12-07: a set restored from part 1's URL lost them, and a
    # `--sha256` given with part 2's URL was no longer checked after a restart)
    meta: dict[str, object] = {"url": display_url(url), "validator": validator}
    if named is not None:
        meta["named_url"] = display_url(named[0])
        if named[1]:
            meta["named_sha256"] = named[1]
    if job_id:
        meta["job"] = job_id
    if total is not None:
        meta["total"] = total
    if sha256:
        meta["sha256"] = sha256
    if signed_query(url):
        meta["signed"] = True
    sidecar(part).write_text(json.dumps(meta), encoding="utf-8")


def resumable(part: Path, url: str) -> tuple[int, str | None]:
    """(bytes to keep, If-Range value) for a .part file left by an earlier attempt or download of
    the same URL; (0, None) when there is none, or it came from elsewhere or without a validator
    (then it is overwritten)."""
    have = size_or_zero(part)
    if not have:
        return 0, None
    try:
        meta = json.loads(sidecar(part).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0, None
    if not isinstance(meta, dict) or meta.get("url") != display_url(url) or not meta.get("validator"):
        return 0, None
    return have, str(meta["validator"])


def size_and_sha256(path: Path, stop: threading.Event) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            if stop.is_set():
                raise InterruptedError("download cancelled while hashing")
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()
