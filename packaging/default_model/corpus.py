"""Corpus: Python standard-library docstrings shaped as ChatML chat turns and plain text.

Docstrings are harvested in child processes (``harvest.py``), one per top-level module, then
cleaned and turned into deterministic samples. Everything is sorted and every random choice comes
from a ``random.Random`` seeded by the config, so the same Python build gives the same corpus.
"""

from __future__ import annotations

import inspect
import json
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import prompts

HARVEST_TIMEOUT_S = 120

# Top-level modules never imported: GUI, side effects on import, test suites, platform-only,
# deprecated aliases or duplicates of another module's functions.
SKIP_MODULES = frozenset({
    "antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib", "test", "lib2to3",
    "ensurepip", "pydoc_data", "xxsubtype", "xxlimited", "xxlimited_35", "msilib", "winreg",
    "winsound", "nt", "msvcrt", "posix", "genericpath", "ntpath", "nturl2path", "distutils",
    "readline", "sre_compile", "sre_parse", "sre_constants", "encodings", "sitecustomize",
    "usercustomize", "webbrowser", "pty", "tty", "getpass", "zipapp", "site",
})
# How the docs name a module whose real import name differs.
DISPLAY_NAMES = {"posixpath": "os.path"}

_SIGNATURE_LINE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")
_ROLE = re.compile(r":[\w:.]+:`~?([^`]+)`")
_DOUBLE_TICKS = re.compile(r"``([^`]+)``")
_SENTENCE_END = re.compile(r"[.!?](?=\s)")


@dataclass(frozen=True)
class Item:
    """One documented object: its dotted name, kind and cleaned texts."""

    qualname: str
    kind: str
    answer: str  # the first paragraph(s), one line each, for a chat answer
    text: str  # the whole cleaned docstring, for plain-text samples


def harvest(python: str = sys.executable, workers: int = 2) -> list[dict]:
    """Import every eligible stdlib module in child processes; return raw docstring records."""
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP_MODULES)
    script = str(Path(__file__).with_name("harvest.py"))

    def one(name: str) -> list[dict]:
        try:
            out = subprocess.run([python, "-I", script, name], capture_output=True, text=True,
                                 timeout=HARVEST_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return []
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, names))
    return [rec for recs in results for rec in recs]


def _sphinx_to_markdown(text: str) -> str:
    return _DOUBLE_TICKS.sub(r"`\1`", _ROLE.sub(r"`\1`", text))


def _strip_signature(lines: list[str]) -> list[str]:
    while lines and _SIGNATURE_LINE.match(lines[0].strip()):
        lines = lines[1:]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def _is_prose(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    first = lines[0]
    if first.startswith((">>>", "-", "*", ":", "+", "|", "=", "..")) or paragraph.rstrip().endswith(":"):
        return False
    return all(line and not line[0].isspace() for line in lines) and bool(re.search(r"[a-z]{3}", first))


def _trim(text: str, max_chars: int) -> str | None:
    """Cut at the last sentence end before max_chars; None when there is none."""
    if len(text) <= max_chars:
        return text
    ends = [m.end() for m in _SENTENCE_END.finditer(text[: max_chars + 1])]
    return text[: ends[-1]] if ends and ends[-1] >= 40 else None


def clean(doc: str, answer_chars: int, text_chars: int) -> tuple[str, str] | None:
    """Return (answer, text) for a raw docstring, or None when it makes no good sample."""
    lines = _strip_signature(_clean_lines(doc))
    if not lines:
        return None
    full = _sphinx_to_markdown("\n".join(lines)).strip()
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", full) if p.strip()]
    answer = ""
    for para in paragraphs:
        if not _is_prose(para):
            break
        joined = re.sub(r"\s+", " ", para).strip()
        candidate = f"{answer} {joined}".strip()
        if answer and len(candidate) > answer_chars:
            break
        answer = candidate
    answer = _trim(answer, answer_chars) if answer else None
    if not answer or len(answer) < 25 or len(answer.split()) < 4:
        return None
    if answer[-1].isalnum() or answer[-1] in ")`'\"":
        answer += "."
    text = _trim(full, text_chars) or full[:text_chars].rsplit("\n", 1)[0]
    return answer, text


def _clean_lines(doc: str) -> list[str]:
    return [line.rstrip() for line in inspect.cleandoc(doc).splitlines()]


def build_items(records: list[dict], answer_chars: int, text_chars: int) -> list[Item]:
    """Turn raw records into cleaned, de-duplicated items sorted by name."""
    items: dict[str, Item] = {}
    for rec in records:
        module = DISPLAY_NAMES.get(rec["module"], rec["module"])
        if module == "builtins" and rec["name"]:
            qualname = rec["name"]  # str.split, not builtins.str.split
        else:
            qualname = f"{module}.{rec['name']}" if rec["name"] else module
        cleaned = clean(rec["doc"], answer_chars, text_chars)
        if cleaned is None or qualname in items:
            continue
        items[qualname] = Item(qualname, rec["kind"], *cleaned)
    return [items[k] for k in sorted(items)]


def split(items: list[Item], val_fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    """Split by item (both of an item's samples land on the same side) with a fixed seed."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(len(items) * val_fraction))
    val_ids = set(order[:n_val])
    train = [it for i, it in enumerate(items) if i not in val_ids]
    val = [it for i, it in enumerate(items) if i in val_ids]
    return train, val


def samples(items: list[Item], seed: int, chats_per_item: int, identity: bool) -> list[list[dict] | str]:
    """Chat conversations (lists of messages) and plain texts, in a deterministic order."""
    rng = random.Random(seed)
    out: list[list[dict] | str] = []
    for item in items:
        for _ in range(chats_per_item):
            out.append(prompts.conversation(item, rng, items))
        out.append(f"{item.qualname}\n\n{item.text}")
    if identity:
        out.extend(prompts.identity_conversations(rng))
    return out
