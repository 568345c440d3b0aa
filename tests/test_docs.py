"""The docs name only source files, CLI subcommands and flags, and HTTP routes that exist.

README.md and docs/*.md are what a newcomer and an operator follow; after many commits they drift
(a renamed module, a dropped flag, a moved route). These checks read the text, not the behaviour:
a source path (`node/...py`, `bench/x.py`, `api/errors.py`) must name a tracked file, a
`swarmllm SUBCOMMAND --flag` must be one the CLI's parser has, and `GET|POST /v1/...` or
`/api/admin/...` one the API's route table has, and `Class.name` a name that class's body has.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SOURCE_SUFFIXES = (".py", ".c", ".h", ".sh", ".spec", ".iss")
# a path-like word ending in a source suffix; globs (`*_tab.py`) and prefixes (`_model.py`) are skipped
PATH_RE = re.compile(r"(?<![\w/.*-])((?:[\w.-]+/)+[\w.-]+(?:" + "|".join(re.escape(s) for s in SOURCE_SUFFIXES) + r"))\b")
ROUTE_RE = re.compile(r"\b(GET|POST|DELETE)(?:/(?:GET|POST|DELETE))? (/[\w/{}.-]*\w\}?)")
ADMIN_RE = re.compile(r"(?<![\w/])(/api/admin/[\w/{}-]*[\w}])")
CLI_RE = re.compile(r"\bswarmllm ([a-z][a-z-]+)((?: (?:--?[a-z][\w-]*|[A-Za-z_.:/@|\[\]…\"'-]+))*)")


def _lines():
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            yield f"{doc.relative_to(REPO)}:{n}", line


def _source_exists(path: str) -> bool:
    # as written from the repo root, or relative to node/ or app/ (`api/errors.py`), or under
    # one of their packages (`pipeline/host.py` for node/inference/pipeline/host.py)
    if any((REPO / base / path).is_file() for base in ("", "node", "app", "tests", "node/inference", "app/ui")):
        return True
    return any(p.is_file() for p in REPO.glob(f"node/**/{path}"))


def test_source_paths_in_the_docs_exist():
    named = [(where, m.group(1)) for where, line in _lines() for m in PATH_RE.finditer(line)]
    assert len(named) > 50  # the pattern still reads the docs
    missing = [f"{where}: {path}" for where, path in named if not _source_exists(path)]
    assert not missing, "the docs name source files that do not exist:\n" + "\n".join(missing)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from node.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _command_line(line: str, m: re.Match) -> str:
    """The command a CLI_RE match starts: to the end of its `code span` (or of the line outside
    one), cut at a shell comment, `;`, `&&` or `|`; every flag in it is checked, not only the ones
    before the first value (`swarmllm run --ctx 4096 --no-such-flag` passed until 2026-12-07)."""
    inside_span = line.count("`", 0, m.start()) % 2 == 1
    end = line.find("`", m.end()) if inside_span else -1
    rest = line[m.start(2):end if end >= 0 else len(line)]
    return re.split(r" #|;|&&| \| ", rest)[0]


def test_cli_commands_and_flags_in_the_docs_exist():
    commands = _subparsers()
    wrong = []
    uses = [(where, line, m) for where, line in _lines() for m in CLI_RE.finditer(line)]
    assert len(uses) > 20  # the pattern still reads the docs
    for where, line, m in uses:
        name, rest = m.group(1), _command_line(line, m)
        if name not in commands:
            wrong.append(f"{where}: swarmllm {name} (no such command)")
            continue
        flags = {s for a in commands[name]._actions for s in a.option_strings}
        named = re.findall(r"(?<![\w-])-[a-z][\w-]*", m.group(2)) + re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
        wrong += [f"{where}: swarmllm {name} {flag} (no such flag)" for flag in dict.fromkeys(named)
                  if re.sub(r"^-v+$", "-v", flag) not in flags]  # -vv, -vvv: -v counted
    assert not wrong, "the docs name CLI commands or flags that do not exist:\n" + "\n".join(wrong)


def _route_table() -> set[tuple[str, str]]:
    # node/api/server.py adds its own few (read from its source) and the route modules' tables
    from node.api import admin, anthropic, embed_routes, llama_native, openai, openai_responses, rerank_routes

    server = (REPO / "node" / "api" / "server.py").read_text()
    table = {(m.upper(), path) for m, path in re.findall(r'app\.router\.add_(get|post)\("([^"]+)"', server)}
    assert ("GET", "/health") in table  # still reads server.py
    for module in (admin, anthropic, embed_routes, llama_native, openai, openai_responses, rerank_routes):
        table |= {(r.method, r.path) for r in module.routes}
    return table


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def test_routes_in_the_docs_exist():
    table = {(method, _shape(path)) for method, path in _route_table()}
    paths = {path for _, path in table}
    wrong = []
    assert sum(1 for _, line in _lines() for _ in ROUTE_RE.finditer(line)) > 10  # still reads the docs
    for where, line in _lines():
        for m in ROUTE_RE.finditer(line):
            method, path = m.group(1), _shape(m.group(2))
            if path.startswith(("/api/models/", "/repos/")):  # Hugging Face's API, not ours
                continue
            if (method, path) not in table:
                wrong.append(f"{where}: {method} {m.group(2)}")
        for m in ADMIN_RE.finditer(line):
            if _shape(m.group(1)) not in paths:
                wrong.append(f"{where}: {m.group(1)}")
    assert not wrong, "the docs name routes the API does not have:\n" + "\n".join(wrong)


def _assigned(target: ast.AST, owner: str | None) -> list[str]:
    """The names an assignment target binds: `x` (owner None) or `self.x` (owner "self")."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _assigned(t, owner)]
    if isinstance(target, ast.Starred):
        return _assigned(target.value, owner)
    if owner is None and isinstance(target, ast.Name):
        return [target.id]
    if owner is not None and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and target.value.id == owner:
        return [target.attr]
    return []


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        return [node.target]
    return []


def _own_members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its methods (properties too), nested classes, class-level assignments
    (dataclass fields, constants) and the attributes its methods assign on self (or cls)."""
    names: set[str] = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        for target in _targets(item):
            names.update(_assigned(target, None))
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.args.args:
            owner = item.args.args[0].arg  # self, or cls in a classmethod
            for inner in ast.walk(item):
                for target in _targets(inner):
                    names.update(_assigned(target, owner))
    return names


def _class_members() -> dict[str, set[str]]:
    own: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in [*REPO.glob("node/**/*.py"), *REPO.glob("app/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                own.setdefault(node.name, set()).update(_own_members(node))
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute)))

    def inherited(name: str, seen: set[str]) -> set[str]:  # its own and its bases' (those in node/ and app/)
        seen.add(name)
        names = set(own.get(name, ()))
        for base in bases.get(name, ()):
            if base in own and base not in seen:
                names |= inherited(base, seen)
        return names

    return {name: inherited(name, set()) for name in own}


def test_class_members_in_the_docs_exist():
    """`RequestTrace.note_failure`: a class of node/ or app/ and a name it (or a base of it there)
    defines: a method or property, a class-level name, or an attribute its methods assign on self.
    Until 2026-12-07 any name its body used counted (`CompletionRun.len`, `Node.asyncio` passed)."""
    members = _class_members()
    wrong, named = [], 0
    for where, line in _lines():
        for code in re.findall(r"`([^`]+)`", line):
            for cls, attr in re.findall(r"\b([A-Z][A-Za-z0-9]+)\.([a-z_][A-Za-z0-9_]*)\b", code):
                if cls in members:
                    named += 1
                    if attr not in members[cls]:
                        wrong.append(f"{where}: {cls}.{attr}")
    assert named > 20  # the pattern still reads the docs
    assert not wrong, "the docs name methods or attributes their classes lack:\n" + "\n".join(wrong)


def test_the_checks_see_what_they_passed_until_2026_12_07():
    """Found in review: a flag after a value, and a name a class body only uses, went unchecked."""
    line = "Start it with `swarmllm run --ctx 4096 --no-such-flag` and then `swarmllm run --port 1 | x --other`."
    first, second = [_command_line(line, m) for m in CLI_RE.finditer(line)]
    assert "--no-such-flag" in first and "--other" not in second
    members = _class_members()
    assert {"len", "self"}.isdisjoint(members["CompletionRun"]) and "asyncio" not in members["Node"]
    assert "summary" in members["ServedModel"] and "memory" in members["ServedModel"]  # a method, a field
    assert "_served" in members["ModelManager"]  # assigned on self in __init__
