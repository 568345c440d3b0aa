"""The set-up the Help-serve and automatic layer choice tests share (tests/pipeline/test_choice_*.py,
test_*changed_file*.py, test_autoserve_moves.py): the choice's timers made short, a data dir with
its models folder, whether a model's slice has loaded, and the wait for a choice's load to fail.
Each does what those tests did inline, with the same values, deadlines and messages; what a test
checks stays in the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node import const
from tests.support.waiting import wait_until


def quick_choice(monkeypatch: pytest.MonkeyPatch, *, retry_min_s: float | None = None,
                 drain_poll_s: float | None = None) -> None:
    """The layer choice at once: its first choice without the look-around (AUTO_SERVE_LOOK_S) or the
    random start delay, a change reacted to after 10 ms; with `retry_min_s`, a failed load chosen
    again after that (AUTO_SERVE_RETRY_MIN_S, doubling); with `drain_poll_s`, a draining slice's
    sessions looked at that often (AUTO_SERVE_DRAIN_POLL_S)."""
    monkeypatch.setattr(const, "AUTO_SERVE_LOOK_S", 0.0)
    monkeypatch.setattr(const, "AUTO_SERVE_START_DELAY_S", 0.0)
    monkeypatch.setattr(const, "AUTO_SERVE_REACT_S", 0.01)
    if retry_min_s is not None:
        monkeypatch.setattr(const, "AUTO_SERVE_RETRY_MIN_S", retry_min_s)
    if drain_poll_s is not None:
        monkeypatch.setattr(const, "AUTO_SERVE_DRAIN_POLL_S", drain_poll_s)


def data_with_models(tmp_path: Path) -> tuple[Path, Path]:
    """(data dir, its models folder, made): the folder the node's watch looks at and catalogues
    at start; the test writes its GGUFs there before the node starts."""
    data = tmp_path / "data"
    models = data / "models"
    models.mkdir(parents=True)
    return data, models


def loaded(node: Any, sha256: str) -> bool:
    """A slice of the model `sha256` is loaded on `node`."""
    return any(h.state == "loaded" for h in node.slice_host.for_model(sha256))


def choice_loaded(node: Any, sha256: str) -> bool:
    """A layer choice of `sha256` loaded and counted: its slice is loaded and the choice's last failure
    is over. (The host marks the slice loaded one loop step before the choosing task resumes and
    clears the failure: a test that read failures() at once after `loaded` saw the stale one, CI.)"""
    m = node.autoserve.model(sha256)
    return loaded(node, sha256) and m is not None and m.last_failure is None


async def choice_failed(node: Any) -> list:
    """Wait (20 s at most) for a layer choice's load to fail: the failures kept (autoserve.failures())."""
    return await wait_until(lambda: node.autoserve.failures(), 20.0, what="the choice's load to fail")
