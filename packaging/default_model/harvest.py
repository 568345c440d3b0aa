"""Child process: import one stdlib top-level module (and its submodules) and dump docstrings.

Run as ``python harvest.py <top-level-name>``; prints one JSON object per line:
``{"module": ..., "name": ..., "kind": "module|class|function|method|property", "doc": ...}``.
Importing runs in a throwaway process so side effects, crashes and hangs stay out of the trainer;
each import also gets an alarm so one slow submodule cannot stall the rest.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import signal
import sys
import warnings

IMPORT_TIMEOUT_S = 10

# Submodule name parts that are test suites, demos, GUI code or private helpers.
_SKIP_PARTS = {"test", "tests", "idle_test", "__main__", "_test", "testing", "demo", "demos"}

# Functions implemented in C are often re-exported by a Python module; accept these owners too.
_OWNER_ALIASES = {"os": {"posix", "nt"}, "posixpath": {"genericpath"}}


def _timeout(_signum, _frame):
    raise TimeoutError("import took too long")


def _import(name: str):
    signal.alarm(IMPORT_TIMEOUT_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # SystemExit, TimeoutError, ImportError, anything: skip the module
        return None
    finally:
        signal.alarm(0)


_SEEN: set[int] = set()  # ids of objects already dumped under a (shorter) public name


def _owned(obj, modname: str, is_package: bool) -> bool:
    owner = getattr(obj, "__module__", None)
    if not isinstance(owner, str) or id(obj) in _SEEN:
        return False
    last = modname.rsplit(".", 1)[-1]
    if owner == modname or owner == "_" + last or owner in _OWNER_ALIASES.get(modname, ()):
        return True
    # A package re-exporting what its submodules define (asyncio.sleep, not asyncio.tasks.sleep).
    return is_package and owner.startswith(modname + ".")


def _emit(module: str, name: str, kind: str, doc) -> None:
    if isinstance(doc, str) and doc.strip():
        print(json.dumps({"module": module, "name": name, "kind": kind, "doc": doc}))


def _class_members(modname: str, cls) -> None:
    for attr in sorted(vars(cls)):
        if attr.startswith("_"):
            continue
        raw = vars(cls)[attr]
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property):
            kind = "property"
        elif inspect.isroutine(raw):
            kind = "method"
        else:
            continue
        _emit(modname, f"{cls.__qualname__}.{attr}", kind, getattr(raw, "__doc__", None))


def _dump_module(modname: str, module) -> None:
    _emit(modname, "", "module", module.__doc__)
    for attr in sorted(dir(module)):
        if attr.startswith("_"):
            continue
        try:
            obj = getattr(module, attr)
        except BaseException:
            continue
        if not _owned(obj, modname, hasattr(module, "__path__")):
            continue
        _SEEN.add(id(obj))
        if inspect.isclass(obj):
            if obj.__qualname__ != attr:  # an alias of a class defined under another name
                continue
            _emit(modname, attr, "class", obj.__doc__)
            _class_members(modname, obj)
        elif inspect.isroutine(obj):
            if getattr(obj, "__name__", attr) != attr:
                continue
            _emit(modname, attr, "function", obj.__doc__)


def _submodules(top) -> list[str]:
    path = getattr(top, "__path__", None)
    if not path:
        return []
    names = []
    for info in pkgutil.walk_packages(path, top.__name__ + ".", onerror=lambda _n: None):
        parts = info.name.split(".")
        if any(p.startswith("_") or p in _SKIP_PARTS for p in parts[1:]):
            continue
        names.append(info.name)
    return sorted(names)


def main(top_name: str) -> None:
    """Dump docstrings of one top-level module and its public submodules."""
    os.environ["DISPLAY"] = ""  # never open a window
    top = _import(top_name)
    if top is None:
        return
    _dump_module(top_name, top)
    for name in _submodules(top):
        module = _import(name)
        if module is not None:
            _dump_module(name, module)
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
