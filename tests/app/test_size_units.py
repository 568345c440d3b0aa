"""Every size the desktop app shows is in one unit, fmt.size's binary one (KiB/MiB/GiB), 2026-12-07:
the Swarm tab wrote its budget and per-layer cost in "MB" (the node's `*_mb` figures, which are
2**20 bytes) beside the Models tab's MiB, and the activity lines the Overview shows said "MB" too
(10^6 bytes for a layer fetch, 2**20 for a Help-serve budget). Checked over the app's formatting
helpers, over the text the app's own code writes, and over the node's activity notes the app lists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.ui import fmt

ROOT = Path(__file__).resolve().parents[2]
# a decimal unit written as a word: " MB", "(MB", "MB/s", "10 GB"; not MiB, not a name like GGUF
DECIMAL_UNIT = re.compile(r"(?<![A-Za-z])[kKMGT]B(?![A-Za-z])")


@pytest.mark.parametrize(("n_bytes", "text"), [(None, fmt.DASH), (512, "512 B"), (3 * 2**10, "3.0 KiB"),
                                               (5 * 2**20 + 2**19, "5.5 MiB"), (3 * 2**30, "3.0 GiB")])
def test_size_writes_binary_units(n_bytes, text):
    assert fmt.size(n_bytes) == text


@pytest.mark.parametrize(("mb", "decimals", "text"), [(1024, 0, "1,024 MiB"), (5.125, 1, "5.1 MiB"),
                                                      (None, 0, fmt.DASH)])
def test_a_node_figure_in_mib_is_written_in_sizes_unit(mb, decimals, text):
    assert fmt.mib(mb, decimals) == text
    if mb is not None and mb < 1024:  # the same bytes read the same in size's cells
        assert fmt.size(int(mb * 2**20)) == fmt.mib(mb, 1)


def _shown_strings(tree: ast.AST, calls: frozenset[str] | None = None) -> list[tuple[int, str]]:
    """The string literals (f-strings' text parts too) of a module, docstrings left out; with
    `calls`, only those inside a call of a function or method of those names."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    roots: list[ast.AST] = [tree]
    if calls is not None:
        roots = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
                 (getattr(n.func, "attr", None) in calls or getattr(n.func, "id", None) in calls)]
    out = []
    for root in roots:
        for node in ast.walk(root):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                out.append((node.lineno, node.value))
    return out


def test_the_apps_own_text_writes_no_decimal_size_unit():
    found = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
             for path in sorted((ROOT / "app").rglob("*.py"))
             for line, text in _shown_strings(ast.parse(path.read_text(encoding="utf-8")))
             if DECIMAL_UNIT.search(text)]
    assert not found, "sizes in the app are written with fmt.size / fmt.mib (MiB):\n" + "\n".join(found)


def test_the_node_activity_lines_the_app_lists_write_no_decimal_size_unit():
    found = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
             for path in sorted((ROOT / "node").rglob("*.py"))
             for line, text in _shown_strings(ast.parse(path.read_text(encoding="utf-8")),
                                              frozenset({"note", "note_activity"}))
             if DECIMAL_UNIT.search(text)]
    assert not found, "activity lines (the Overview lists them) give sizes in MiB:\n" + "\n".join(found)
