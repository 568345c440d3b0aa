"""What an output must look like, independent of the engine that enforces it.

A spec is a small tree of plain dicts (so it travels to the peer that samples as it is, inside
SamplingParams.grammar):

  {"type": "json", "schema": {...} | None}        one JSON value (None: any JSON object)
  {"type": "literal", "text": "..."}              exact text (special tokens such as
                                                  `<tool_call>` or `[TOOL_CALLS]` written out)
  {"type": "text", "stop": "..." | None}          free text (up to `stop` when given)
  {"type": "seq", "items": [spec, ...]}           one after the other
  {"type": "alt", "items": [spec, ...]}           exactly one of them
  {"type": "repeat", "item": spec, "min": m, "max": n | None, "sep": "..."}
  {"type": "regex", "pattern": "..."}             text the regex matches whole (vLLM's guided_regex)
  {"type": "gbnf", "grammar": "..."}              a GBNF grammar (llama-server's `grammar`; llguidance's
                                                  Lark passes as it is), converted where it is compiled

The API layer builds specs (response_format, tool_choice); node.inference.constrain compiles them
for the grammar engine where sampling happens and masks the logits there.
"""

from __future__ import annotations

from typing import Any

Spec = dict[str, Any]
KINDS = ("json", "literal", "text", "seq", "alt", "repeat", "regex", "gbnf")
MAX_DEPTH = 16
MAX_NODES = 4096  # a spec from a peer is bounded before anything compiles it
# a grammar's or regex's text: llguidance's GBNF converter is quadratic in a chain of rules (2,000
# rules, 63 kB: 6 s; 8,000: 90 s), and runs in an executor (or on a peer's sampling thread)
MAX_GRAMMAR_CHARS = 64 * 1024


class GrammarUnreadable(ValueError):
    """A GBNF grammar that llguidance's converter cannot read (its reason)."""


class UnknownKind(ValueError):
    """A spec node of a type this version does not know (a newer peer's grammar kind): `kind`."""

    def __init__(self, kind: str):
        super().__init__(f"unknown grammar spec type {kind!r}")
        self.kind = kind


def json_value(schema: dict[str, Any] | None = None) -> Spec:
    """One JSON value matching `schema` (None: any JSON object, as OpenAI's json_object mode)."""
    return {"type": "json", "schema": schema}


def literal(text: str) -> Spec:
    return {"type": "literal", "text": text}


def free_text(stop: str | None = None) -> Spec:
    return {"type": "text", "stop": stop}


def regex(pattern: str) -> Spec:
    return {"type": "regex", "pattern": pattern}


def gbnf(grammar: str) -> Spec:
    return {"type": "gbnf", "grammar": grammar}


def seq(*items: Spec) -> Spec:
    return {"type": "seq", "items": list(items)}


def alt(*items: Spec) -> Spec:
    return {"type": "alt", "items": list(items)}


def repeat(item: Spec, min_count: int = 1, max_count: int | None = None, sep: str = "") -> Spec:
    return {"type": "repeat", "item": item, "min": min_count, "max": max_count, "sep": sep}


def kinds(spec: Spec) -> set[str]:
    """The node types a (validated) spec holds, at any depth."""
    out = {spec["type"]}
    for item in spec.get("items") or ():
        out |= kinds(item)
    if spec["type"] == "repeat":
        out |= kinds(spec["item"])
    return out


def validate(spec: Any, depth: int = 0, _seen: list[int] | None = None) -> Spec:
    """Check the shape of a spec (one received from a peer, say); raises ValueError naming the problem."""
    seen = _seen if _seen is not None else [0]
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise ValueError(f"grammar spec has more than {MAX_NODES} nodes")
    if depth > MAX_DEPTH:
        raise ValueError("grammar spec nested too deeply")
    if isinstance(spec, dict) and isinstance(spec.get("type"), str) and spec["type"] not in KINDS:
        raise UnknownKind(spec["type"][:40])
    if not isinstance(spec, dict) or spec.get("type") not in KINDS:
        raise ValueError(f"bad grammar spec node: {str(spec)[:80]}")
    kind = spec["type"]
    if kind == "json":
        if spec.get("schema") is not None and not isinstance(spec["schema"], dict | bool):
            raise ValueError("grammar json node: schema must be an object")
    elif kind == "literal":
        if not isinstance(spec.get("text"), str) or not spec["text"]:
            raise ValueError("grammar literal node: text must be a non-empty string")
    elif kind == "text":
        if spec.get("stop") is not None and not isinstance(spec["stop"], str):
            raise ValueError("grammar text node: stop must be a string")
    elif kind in ("regex", "gbnf"):
        key = "pattern" if kind == "regex" else "grammar"
        if not isinstance(spec.get(key), str) or not spec[key] or len(spec[key]) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"grammar {kind} node: {key} must be a non-empty string of at most "
                             f"{MAX_GRAMMAR_CHARS} characters")
    elif kind in ("seq", "alt"):
        items = spec.get("items")
        if not isinstance(items, list) or not items:
            raise ValueError(f"grammar {kind} node: items must be a non-empty list")
        for item in items:
            validate(item, depth + 1, seen)
    else:  # repeat
        validate(spec.get("item"), depth + 1, seen)
        lo, hi = spec.get("min", 1), spec.get("max")
        if not isinstance(lo, int) or lo < 0 or (hi is not None and (not isinstance(hi, int) or hi < max(lo, 1))):
            raise ValueError("grammar repeat node: bad min/max")
        if not isinstance(spec.get("sep", ""), str):
            raise ValueError("grammar repeat node: sep must be a string")
    return spec


def after(spec: Spec, text: str) -> list[Spec] | None:
    """What must follow `text` in the outputs of `spec` that begin with it, as a sequence of specs
    (empty: nothing more), or None when none begins with it as a literal (a JSON value, free text,
    a repeat that may be empty). A reasoning model's thoughts that end at a tool call's opener go on
    with the rest of the call's grammar (node.inference.reasoning)."""
    kind = spec["type"]
    if kind == "literal":
        if not spec["text"].startswith(text):
            return None
        rest = spec["text"][len(text):]
        return [literal(rest)] if rest else []
    if kind == "seq":
        head = after(spec["items"][0], text)
        return None if head is None else head + spec["items"][1:]
    if kind == "alt":
        branches = [b for item in spec["items"] if (b := after(item, text)) is not None]
        if not branches:
            return None
        if len(branches) == 1:
            return branches[0]
        full = [b[0] if len(b) == 1 else seq(*b) for b in branches if b]
        if not full:
            return []
        one = full[0] if len(full) == 1 else alt(*full)
        return [repeat(one, 0, 1)] if len(full) < len(branches) else [one]  # (a branch that ends there)
    if kind == "repeat":
        lo, hi, sep = spec.get("min", 1), spec.get("max"), spec.get("sep") or ""
        head = None if lo == 0 else after(spec["item"], text)
        if head is None:
            return None
        if hi == 1:
            return head
        tail = seq(literal(sep), spec["item"]) if sep else spec["item"]
        return [*head, repeat(tail, lo - 1, None if hi is None else hi - 1)]
    return None
