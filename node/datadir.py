"""The node's data dir: created on first run, secrets written 0600."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import stat
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from node import const
from node.errors import NodeError
from node.logs import kv

log = logging.getLogger(__name__)

API_KEY_FILE = "api_key"
LOCK_FILE = "node.lock"  # held (an OS lock) by the node running on this data dir
CONFIG_FILE = "config.toml"
MODELS_DIR = "models"
WEIGHT_CACHE_DIR = "cache/weights"  # converted slice weights (node/inference/weights/cache.py)

DEFAULT_CONFIG_TEXT = """\
# SwarmLLM node configuration. Precedence: this file < SWARMLLM_* environment < command line.
# Every key is a NodeConfig field (see node/config.py); sections are only for grouping.

[api]
# port = 8800
# host = "127.0.0.1"   # "0.0.0.0": every network (apps in containers, WSL, on other devices)
# allowed_hosts = []   # Host names accepted besides loopback names and IP addresses: ["host.docker.internal"]
# require_api_key_for_inference = true  # false: apps on this machine (and anything forwarded from loopback) need no key

[inference]
# n_threads = 0        # 0 = physical cores
# cpu_only = false
# serve = "whole"      # "auto": choose which layers of each --model to serve from the swarm
# slice_budget_mb = 0  # memory for auto-chosen slices; 0 = free memory minus headroom
# max_concurrent = 4   # requests a whole model decodes at once (one batch); more wait in its queue
# kv_cache_seqs = 4    # finished conversations whose KV stays cached per model (prefix reuse, both routes)
# speculative_max_draft = 8  # n-gram speculation: draft tokens per decode step; 0 = off
# flash_attention = false  # true: faster with many requests at once; seeded texts may vary with load
# slice_weight_cache_mb = 16384  # converted slice weights kept on disk (cache/weights); 0 = off

[network]
# mdns = true
# bootstrap = ["192.168.1.20:8810"]
"""


class DataDirInUse(NodeError):
    """Another node (another process, or another Node here) runs on this data dir."""

    code = "data_dir_in_use"


class DataDirLock:
    """The data dir's lock, held while a node runs on it: a second node there would share its
    identity (the same node id twice in the swarm), its API key and every file it writes. An OS
    lock (flock / msvcrt), so a killed process holds none: nothing is ever stale."""

    def __init__(self, data_dir: Path):
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        self._guard = threading.Lock()  # acquire runs on an executor: a stop may come meanwhile
        self._released = False
        self.refused = False  # another node holds it (its node.log is not told that this one stopped)

    def acquire(self) -> None:
        """Take the lock (blocking: file I/O); DataDirInUse naming the holder's pid when taken."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | binary_flag(), 0o600)
        try:
            _lock(fd)
        except BlockingIOError:
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            except OSError:  # Windows: the holder's locked byte cannot be read
                holder = "?"
            os.close(fd)
            self.refused = True
            raise DataDirInUse(f"another SwarmLLM node (pid {holder}) is running with the data dir "
                               f"{self.path.parent}: stop it, or give this one another --data-dir") from None
        except OSError as exc:  # a file system without locks (some network shares): run, unguarded
            log.warning("DIAG: data dir lock not available, running without it %s", kv(error=exc.strerror or exc))
        except BaseException:
            os.close(fd)
            raise
        with self._guard:
            if self._released:  # the node stopped while this ran (a start cancelled): not held
                os.close(fd)
                return
            self._fd = fd  # held from here: release() lets it go whatever happens next
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:  # a full disk: the start fails, and the lock is not left held by no one
            self.release()
            raise

    def release(self) -> None:
        """Let the lock go (idempotent; the process's exit does it too); an acquire still running
        then lets it go at once."""
        with self._guard:
            self._released = True
            fd, self._fd = self._fd, None
        if fd is not None:
            _unlock(fd)  # Windows frees a lock at close only "eventually": a quick restart must find it free
            os.close(fd)


if sys.platform == "win32":
    import msvcrt

    _LOCK_AT = 1 << 20  # the byte locked, past the pid (a locked byte cannot be read by others)

    def _lock(fd: int) -> None:
        os.lseek(fd, _LOCK_AT, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLK):  # another process holds it
                raise BlockingIOError(str(exc)) from exc
            raise  # no locks on this file system: run unguarded

    def _unlock(fd: int) -> None:
        try:
            os.lseek(fd, _LOCK_AT, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except OSError:
            pass  # not held (a file system without locks): closing is all there is
else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        pass  # flock's lock goes with the descriptor's close


def binary_flag() -> int:
    """os.O_BINARY where there is one (Windows), else 0. A descriptor from os.open is in the C
    runtime's text mode there: each "\n" written became "\r\n" after Python's own text layer had
    already made it one, so config.toml and api_key were written with "\r\r\n" (every line of
    config.toml double-spaced in an editor)."""
    return getattr(os, "O_BINARY", 0)


def open_private(path: Path) -> int:
    """A descriptor of `path` truncated for writing, created 0600 (never briefly readable by
    others), bytes written as given."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | binary_flag(), 0o600)


def write_private(path: Path, text: str) -> None:
    """Write a file readable only by its owner (0600), created with that mode from the start, and on
    disk before this returns (its callers rename it over the old file next: without the fsync a power
    cut could leave the renamed file empty; 2026-12-07)."""
    fd = open_private(path)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, 0o600)


def linked_target(path: Path) -> Path:
    """Where a data-dir file that is a link (into an encrypted or synced folder) is written: its
    target, a file or nothing yet (a folder not mounted: the write fails, the link stays), so that
    the link stays and what is written reaches the folder; else `path` itself. A link to anything
    else (a device: /dev/full, a folder) is never written through: a file renamed over /dev/full
    replaced the device (2026-12-07)."""
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    return target if target.is_file() or not os.path.lexists(target) else path


def write_atomic(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write a file whole or not at all: an fsynced temporary file beside it, renamed over it; a
    failed write (a full disk) removes the temporary file (it was left behind) and raises an OSError
    naming `path`, not the temporary file. `private`: created 0600 from the start. A link is written
    through, to its target (the link was replaced by a plain file; 2026-12-07, review r38)."""
    path = linked_target(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = open_private(tmp) if private else os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | binary_flag(), 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if private:
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # (a read-only mount refuses the unlink too: EROFS)
            tmp.unlink(missing_ok=True)
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc  # (the errno's own subclass)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def keep_private(path: Path) -> None:
    """A secret file (api_key, identity.key) readable by others is made 0600, with a warning.
    Where the file system keeps no such bits, nothing can be tightened and nothing is said but a
    DEBUG line: on Windows `st_mode` is 0o666 for every writable file and chmod sets only the
    read-only flag (the data dir is in the user's own AppData); FAT/exFAT drives and some shares
    are the same. It warned "tightened to 0600" at every start there (2026-12-06)."""
    if not path.stat().st_mode & 0o077:
        return
    os.chmod(path, 0o600)
    if path.stat().st_mode & 0o077:
        log.debug("DIAG: owner-only permissions not kept by this file system %s", kv(path=path))
        return
    log.warning("%s was readable by others; permissions tightened to 0600", path.name)


def ensure_data_dir(data_dir: Path) -> None:
    """Create the data dir layout and a commented config.toml on first run."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / MODELS_DIR).mkdir(exist_ok=True)
    config = data_dir / CONFIG_FILE
    if not config.exists():
        tmp = config.with_name(CONFIG_FILE + ".tmp")
        try:  # whole or not at all: a full disk left an empty config.toml, the next start took it as the user's
            write_private(tmp, DEFAULT_CONFIG_TEXT)
            os.replace(tmp, config)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        log.info("created config file %s", config)


def present(path: Path) -> bool:
    """Whether a data-dir file is there to be read: a file, a folder where it belongs (said), or a
    link to nothing (a sync or encrypted folder not mounted yet: said, never taken for no file and
    written over; 2026-12-07, review r33). A device (/dev/full reads without end) is not."""
    return path.is_file() or path.is_dir() or (path.is_symlink() and not path.exists())


def read_api_key(data_dir: Path) -> str:
    """The key in the data dir's `api_key` ("" when there is none). A file that is not text (a
    crash or a copy damaged it) is a NodeError naming it: clients hold the old key, so it is
    neither replaced nor overwritten here (it was a UnicodeDecodeError traceback)."""
    path = data_dir / API_KEY_FILE
    if not present(path):  # (a folder, a link to nothing there is said, not taken for no key)
        return ""
    try:
        return read_data_file(path).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise NodeError(f"{path} is damaged (not text): put the key your clients use back in it, or "
                        "move it away to have a new one made", code="api_key_unreadable") from None
    except OSError as exc:  # not this user's to read (made with sudo): was a PermissionError traceback
        raise NodeError(cannot_read(path, exc), code="api_key_unreadable") from None


def cannot_read(path: Path, exc: OSError) -> str:
    """What to tell a user about a file of the data dir that could not be read (it is left as it
    is: an identity, key or swarm is never replaced because it was merely unreadable). The wording
    comes from what is there, not from the errno: Windows says PermissionError, not EISDIR, for a
    folder (2026-12-07, review r33)."""
    if path.is_dir():
        return f"{path} is a directory where a file belongs: move it away, or give another --data-dir"
    if path.is_symlink() and not path.exists():  # its target not there (a sync folder not mounted yet)
        return (f"cannot read {path}: it links to {os.readlink(path)}, which is not there: make it reachable "
                "(mount it), or give another --data-dir")
    if exc.errno in _TRANSIENT:  # (read again briefly before this is said: read_data_file)
        return (f"cannot read {path} ({exc.strerror or exc}): if another program holds it (a sync tool, an "
                "antivirus) try again; else give this user the right to read it, or give another --data-dir")
    return f"cannot read {path} ({exc.strerror or exc}): try again, or give another --data-dir"


# a read failing with these may succeed a moment later (a lock, a rename under way, a share's hiccup)
_TRANSIENT = {errno.EACCES, errno.EPERM, errno.ENOENT, errno.EIO, errno.EAGAIN, errno.EBUSY}


def read_data_file(path: Path, *, tries: int = const.DATA_FILE_READ_TRIES) -> bytes:
    """A data-dir file's bytes (blocking), read again briefly (`tries` in all) when the read fails
    for a reason that may pass: a Windows sharing violation or an antivirus' lock, a rename between
    a look and the read; the last OSError otherwise (a folder, not this user's to read)."""
    for attempt in range(tries):
        try:
            return path.read_bytes()
        except OSError as exc:
            if exc.errno not in _TRANSIENT or path.is_dir() or attempt + 1 == tries:
                raise
        time.sleep(const.DATA_FILE_READ_RETRY_S)
    raise AssertionError("unreachable")


# Windows: a rename fails whole for a file another program holds (a link then an unlink left both names)
_RENAME_FIRST = os.name == "nt"


def _left_beside(path: Path, broken: Path) -> bool:
    """Whether `broken` is a second name of `path`'s file, left by an earlier move whose unlink failed."""
    try:
        a, b = os.lstat(path), os.lstat(broken)
    except OSError:
        return False
    return stat.S_ISREG(a.st_mode) and a.st_ino != 0 and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def keep_aside(path: Path) -> Path:
    """Move a damaged data-dir file to `NAME.broken`, or `NAME.broken-2`, `-3`... when that is taken:
    never over an earlier kept-aside copy, the user's only way back to what it held (a second damaged
    swarm.json overwrote the first one's .broken, secret and all, until 2026-12-07, review r33).
    Its new path; an OSError when it could not be moved (it is then where it was, maybe with a second
    name that a later call takes up instead of adding `.broken-N` at each start; review r38)."""
    for n in range(1, 1000):
        broken = path.with_name(path.name + (".broken" if n == 1 else f".broken-{n}"))
        if os.path.lexists(broken):
            if _left_beside(path, broken):  # the same file: only its first name is left to go
                os.unlink(path)
                return broken
            continue
        if _RENAME_FIRST or path.is_symlink():  # (a link: the link itself is kept aside, not its target)
            try:
                os.rename(path, broken)
            except FileExistsError:  # (Windows never renames over a name)
                continue
            return broken
        try:
            os.link(path, broken)  # never over a file another process put there meanwhile
        except FileExistsError:
            continue
        except OSError:  # no hard links here (FAT, some shares): a rename to the free name
            os.rename(path, broken)
            return broken
        try:
            os.unlink(path)
        except OSError:  # (held): not moved; the second name goes too where it can
            with contextlib.suppress(OSError):
                os.unlink(broken)
            raise
        return broken
    raise OSError(errno.EEXIST, "too many kept-aside copies", str(path))


def load_or_create_api_key(data_dir: Path) -> str:
    """The API key from `api_key` (0600), created on first run."""
    path = data_dir / API_KEY_FILE
    if present(path):
        key = read_api_key(data_dir)
        if key:
            keep_private(path)
            return key
    key = "sk-swarm-" + secrets.token_hex(24)
    # whole or not at all: a write cut by a power cut left an empty api_key, and the next start made
    # another key, which every app configured with the first one then lacked (2026-12-07)
    write_atomic(path, (key + "\n").encode(), private=True)
    log.info("created API key file %s", path)
    return key


DESKTOP_SECTION = "desktop"  # config.toml's table the desktop app writes (its controls' choices)
_TABLE_HEADER = re.compile(r"\[\[?\s*[A-Za-z0-9_.\-\"' ]+\s*\]\]?")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # a TOML basic string: JSON's escapes are TOML's, but not its surrogate pairs (characters
        # beyond the BMP stay as they are) and not a raw DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _table_name(header: str) -> str | None:
    """The name of a single-bracket table header as TOML reads it (spaces and quotes around it
    dropped); None for an array-of-tables header."""
    if header.startswith("[["):
        return None
    return header[1:-1].strip().strip('"').strip("'").strip()


def save_desktop_settings(data_dir: Path, values: dict[str, Any]) -> None:
    """Rewrite config.toml's [desktop] table with `values`, keeping every other line (the user's
    comments and keys) as it was; later tables win when flattened, so these override the same
    keys elsewhere in the file (blocking: file I/O). The result is parsed before it replaces the
    file, which stays 0600."""
    path = data_dir / CONFIG_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    kept, inside = [], False
    for line in lines:
        head = line.split("#", 1)[0].strip()
        if _TABLE_HEADER.fullmatch(head):  # (not a line of a multi-line array)
            inside = _table_name(head) == DESKTOP_SECTION  # `[desktop]`, `[ desktop ]`, `["desktop"]`
            if inside:
                continue
        if not inside:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    block = ["", f"[{DESKTOP_SECTION}]", "# written by the desktop app (Swarm tab: Help serve this model; the tray's "
             "Pause contributing)", *(f"{k} = {_toml_value(v)}" for k, v in values.items())]
    text = "\n".join(kept + block) + "\n"
    tomllib.loads(text)  # never write a file the next start could not read
    tmp = path.with_name(path.name + ".tmp")
    write_private(tmp, text)
    os.replace(tmp, path)


# the files of the data dir (a folder where one belongs is said so; Windows gives EACCES, not EISDIR)
DATA_FILES = {API_KEY_FILE, LOCK_FILE, CONFIG_FILE, "identity.key", "identity.crt", "swarm.json", "node.log",
              "peers.json", "model_hashes.json"}
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
CANNOT_WRITE = _NO_SPACE | {errno.EROFS, errno.EACCES, errno.EPERM}


def data_dir_error(data_dir: Path, exc: OSError) -> str | None:
    """What to tell a user for an OSError about the data dir or a file in it (None when it is not
    one): which file, where, and what to do. `swarmllm run` and the desktop app say the same."""
    if exc.filename and os.path.isdir(exc.filename) and (exc.errno == errno.EISDIR or (
            exc.errno in (errno.EACCES, errno.EPERM) and Path(exc.filename) in {data_dir / f for f in DATA_FILES})):
        return cannot_read(Path(exc.filename), exc)  # a folder where a file belongs (Windows: EACCES for it)
    if exc.errno in CANNOT_WRITE:
        what = f"{exc.filename} ({exc.strerror})" if exc.filename else f"in the data dir {data_dir} ({exc.strerror})"
        if exc.errno in _NO_SPACE:
            return f"cannot write {what}: free some space there, or give another --data-dir"
        return f"cannot write {what}: give a writable directory with --data-dir"
    if exc.errno == errno.EEXIST and exc.filename and os.path.lexists(exc.filename) \
            and not os.path.isdir(exc.filename) and Path(exc.filename) != data_dir:  # a file named models
        return f"{exc.filename} is a file where a folder belongs: move it away, or give another --data-dir"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        in_the_way = next((p for p in (data_dir, *data_dir.parents) if p.exists() and not p.is_dir()), None)
        if in_the_way is not None:
            which = "a file" if in_the_way == data_dir else f"{in_the_way} is a file"
            return (f"cannot use the data dir {data_dir} ({which}, not a directory): "
                    "give a writable directory with --data-dir")
    return None
