"""Node is composed of mixins (hello.py, swarm_actions.py, url_models.py, model_actions.py) that declare
what they need of Node as stubs raising NotImplementedError. A stub earlier in the MRO than the real
method shadows it: a mixin's `_async_announce` stub did so in a refactor, and the layer choice failed
with a bare NotImplementedError at run time. Every name Node resolves must reach a real definition."""

from __future__ import annotations

import ast
import inspect
import textwrap

from node.node import Node


def _is_stub(obj: object) -> bool:
    func = obj.fget if isinstance(obj, property) else obj
    if not inspect.isfunction(func):
        return False
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0])


def test_no_mixin_stub_shadows_a_real_method():
    shadowed = []
    for name in dir(Node):
        for klass in Node.__mro__:  # the definition Node's attribute lookup finds first
            if name in vars(klass):
                if _is_stub(vars(klass)[name]):
                    shadowed.append(f"{name} (a stub in {klass.__name__})")
                break
    assert shadowed == []


def test_the_check_sees_a_shadowing_stub():
    class Needs:
        def announce(self) -> None:  # Node's
            raise NotImplementedError

    class Gives:
        def announce(self) -> None:
            return None

    class Wrong(Needs, Gives):
        pass

    first = next(k for k in Wrong.__mro__ if "announce" in vars(k))
    assert _is_stub(vars(first)["announce"])
    assert not _is_stub(vars(Gives)["announce"])
