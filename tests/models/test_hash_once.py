"""A model file asked to be hashed twice at once is read once (2026-12-06): a split set's part
downloaded alone and completing the set, the folder watch seeing the same file land, and the GUI's
Add each asked the hash cache for part 1's sha256 and each read the whole file beside the other
(minutes of disk and CPU for a multi-GB part on a laptop). The second caller now waits for the
first one's digest; when the first fails, the second hashes on its own."""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import pytest

from node.models import hash_cache
from node.models.hash_cache import HashCache


def _poll(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def gated(monkeypatch):
    """sha256_file counting its calls and held until `gate` is set; `fail_first` makes the first
    call raise as a file read error would."""
    state = {"calls": 0, "gate": threading.Event(), "fail_first": False}
    real = hash_cache.sha256_file

    def held(path, stop):
        state["calls"] += 1
        state["gate"].wait(30)
        if state["fail_first"] and state["calls"] == 1:
            raise OSError("read error")
        return real(path, stop)

    monkeypatch.setattr(hash_cache, "sha256_file", held)
    return state


def _two_callers(cache, path, gated, caplog):
    got: dict[str, object] = {}

    def call(who):
        try:
            got[who] = cache.get_or_compute(path)
        except OSError as exc:
            got[who] = exc

    first = threading.Thread(target=call, args=("first",))
    first.start()
    _poll(lambda: gated["calls"] == 1, "the first hash to start")
    second = threading.Thread(target=call, args=("second",))
    second.start()
    _poll(lambda: "already being hashed" in caplog.text, "the second caller to wait")
    gated["gate"].set()
    first.join(30)
    second.join(30)
    return got


def test_a_file_asked_twice_at_once_is_hashed_once(tmp_path, gated, caplog):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"x" * 100_000)
    cache = HashCache(tmp_path / "hashes.json")
    with caplog.at_level(logging.INFO):
        got = _two_callers(cache, path, gated, caplog)
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    assert got == {"first": want, "second": want}
    assert gated["calls"] == 1
    assert caplog.text.count("DIAG: hashed model file") == 1


def test_when_the_first_hash_fails_the_waiting_caller_hashes_itself(tmp_path, gated, caplog):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"y" * 100_000)
    cache = HashCache(None)
    gated["fail_first"] = True
    with caplog.at_level(logging.INFO):
        got = _two_callers(cache, path, gated, caplog)
    assert isinstance(got["first"], OSError)
    assert got["second"] == hashlib.sha256(path.read_bytes()).hexdigest() and gated["calls"] == 2
    assert cache.get_or_compute(path) == got["second"] and gated["calls"] == 2  # remembered
