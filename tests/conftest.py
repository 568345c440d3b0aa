"""Shared fixtures: every test is hermetic (own temp data dir, no env vars, no internet)."""

from __future__ import annotations

import os

import pytest

# Tests never read the developer's real data dir or config from the environment.
for _key in list(os.environ):
    if _key.startswith("SWARMLLM_"):
        del os.environ[_key]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture
def data_dir(tmp_path):
    """A fresh node data dir."""
    d = tmp_path / "data"
    d.mkdir()
    return d
