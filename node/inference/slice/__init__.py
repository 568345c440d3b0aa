"""Torch slice engine: run layers [a, b) of a GGUF model and hand hidden states to the next peer.

Public names (imported lazily so that `import node.inference.slice.testsplit` stays cheap):
`SliceModel`, `Session`.
"""

from __future__ import annotations

__all__ = ["Session", "SliceModel"]


def __getattr__(name: str):
    if name in __all__:
        from node.inference.slice import model

        return getattr(model, name)
    raise AttributeError(name)
