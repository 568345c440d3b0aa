"""The rooms of node/ and the arrows between them hold (import-linter contracts in pyproject.toml).

The contracts: node never imports app; node's rooms are layered (commands → node → api → diagnostics
→ inference → net | models → the shared kernel: trace, metrics, config, errors, ...); the engine,
the network and the models never import the HTTP layer; the network never imports inference or
models; no import cycles among the packages and modules of node/ at any depth. TYPE_CHECKING
imports count. A broken contract prints which imports break it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

importlinter = pytest.importorskip("importlinter")

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept(capsys, monkeypatch):
    from importlinter import configuration
    from importlinter.application.use_cases import lint_imports

    configuration.configure()  # what the lint-imports command does first
    monkeypatch.chdir(REPO)  # the graph is built from the checkout, not an installed copy
    monkeypatch.syspath_prepend(str(REPO))
    kept = lint_imports(config_filename=os.fspath(REPO / "pyproject.toml"), cache_dir=None, no_logo=True)
    out = capsys.readouterr().out
    assert kept, out
    assert "5 kept, 0 broken" in out, out
