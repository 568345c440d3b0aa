"""A reasoning model's thinking budget, enforced where tokens are sampled.

Anthropic's `thinking: {"type": "enabled", "budget_tokens": N}` (and llama-server's own
`reasoning_budget_tokens` / `thinking_budget_tokens` on chat completions) caps the thoughts: after N
tokens inside them the closing tag is forced, token by token, so the answer follows, as
llama-server's reasoning-budget sampler does (common/reasoning-budget.cpp). Without it a model could
think until max_tokens and never answer.

The request's budget travels in SamplingParams.reasoning_budget (to the peer that samples:
this node's llama.cpp, a chain's last segment, a whole holder), a plain dict:
  {"tokens": N, "open": "<think>", "close": "</think>", "inside": bool}
`inside`: the reply starts inside the thoughts (the generation prompt or the client's prefill
opened them); otherwise an opening tag at the very start of the reply opens them, as
node.inference.reasoning splits the reply (llama-server also re-arms on an opening tag later in the
answer, which the splitter does not take as thoughts). As llama-server: the tokens after the
opening tag count, the closing tag written by the model ends the count, and the closing tag is
forced only at a UTF-8 character's end. The tags are matched on the text (a tag written in several tokens counts as well) and the
forced tokens are the closing tag as the tokenizer spells it (one special token where it is one).
`ends` (optional; only where the request offers tools): tool-call openers that end the thoughts as
the closing tag does (node.inference.reasoning), so they end the count too, as llama-server's
`thinking_end_tags` do; an older peer ignores the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from node.inference.tokenizer import ModelTokenizer

MAX_TAG_CHARS = 64
MAX_END_TAGS = 8


def spec(tokens: int, open_tag: str, close_tag: str, inside: bool, written: str = "",
         rearm: bool = False, ends: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """`written`: the end of the text before the reply (the client's prefill) that may be a tag's
    start ("<thi"), which the reply's first tokens may finish. `rearm`: an opening tag later in the
    reply starts a new budget (gpt-oss: every analysis message is thoughts, and a model whose
    thoughts were cut writes another; llama-server re-arms so for every model)."""
    out = {"tokens": tokens, "open": open_tag, "close": close_tag, "inside": inside,
           "written": written[-MAX_TAG_CHARS:]}
    if rearm:  # (only then: a peer from before it refuses nothing, it ignores the key)
        out["rearm"] = True
    if ends:
        out["ends"] = list(ends)
    return out


def validate(value: Any) -> dict[str, Any]:
    """A budget received from a peer; raises ValueError / TypeError on a malformed one."""
    if not isinstance(value, dict):
        raise TypeError("reasoning_budget must be an object")
    tokens, open_tag, close_tag, inside = value["tokens"], value["open"], value["close"], value["inside"]
    if type(tokens) is not int or not 0 <= tokens < 1 << 31:
        raise ValueError("reasoning_budget.tokens must be a non-negative integer")
    for tag in (open_tag, close_tag):
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG_CHARS:
            raise ValueError(f"reasoning_budget tags must be strings of 1 to {MAX_TAG_CHARS} characters")
    if not isinstance(inside, bool):
        raise TypeError("reasoning_budget.inside must be a boolean")
    written = value.get("written", "")
    if not isinstance(written, str) or len(written) > MAX_TAG_CHARS:
        raise ValueError(f"reasoning_budget.written must be a string of at most {MAX_TAG_CHARS} characters")
    rearm = value.get("rearm", False)
    if not isinstance(rearm, bool):
        raise TypeError("reasoning_budget.rearm must be a boolean")
    ends = value.get("ends", [])
    if not isinstance(ends, list | tuple) or len(ends) > MAX_END_TAGS:
        raise TypeError(f"reasoning_budget.ends must be a list of at most {MAX_END_TAGS} tags")
    for tag in ends:
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG_CHARS:
            raise ValueError(f"reasoning_budget.ends must be strings of 1 to {MAX_TAG_CHARS} characters")
    return spec(tokens, open_tag, close_tag, inside, written, rearm, tuple(ends))


def _utf8_complete(data: bytes) -> bool:
    """Whether `data` ends at a character's end (not inside a multi-byte sequence)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII: how long its sequence is
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back >= need
    return True


class ThinkBudget:
    """One generation's budget: follows the sampled tokens, forces the closing tag when spent."""

    def __init__(self, tok: ModelTokenizer, budget: dict[str, Any]):
        self._tok = tok
        self.budget = budget["tokens"]
        self.open, self.close = budget["open"], budget["close"]
        self.ends = (self.close, *budget.get("ends", ()))  # what ends the thoughts' count
        self._forced = tok.tokenize(self.close, add_bos=False, special=True)
        self._tail = ""  # the last characters written: a tag may come in several tokens
        self._pending = b""  # bytes of an unfinished UTF-8 character
        self.remaining = self.budget
        self._rearm = bool(budget.get("rearm"))
        self.state = "idle"
        self.force_at = 0
        if budget["inside"]:
            self._enter()
        self._tail = budget.get("written", "")

    def _enter(self) -> None:
        self.state, self.remaining, self._tail = "counting", self.budget, ""
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.state, self.force_at = ("forcing", 0) if self._forced else ("done", 0)

    @property
    def forcing(self) -> int | None:
        """The token that must come next, or None."""
        return self._forced[self.force_at] if self.state == "forcing" else None

    def apply(self, logits: np.ndarray) -> None:
        """Leave only the forced token (in place), when forcing."""
        token = self.forcing
        if token is None:
            return
        keep = logits[token]
        logits[:] = -np.inf
        logits[token] = keep if np.isfinite(keep) else 0.0

    def _text(self, token: int) -> str:
        piece = self._tok.piece(token)
        if not piece:  # a control token: a tag may be one ([THINK]) or begin with one (Gemma 4's
            # `<|channel>` before `thought` as text; until 2026-12-06 its budget never began)
            special = self._tok.special_piece(token)
            if special and any(tag.startswith(special) for tag in (self.open, *self.ends)):
                piece = special.encode()
        data = self._pending + piece
        if not _utf8_complete(data):
            self._pending = data
            return ""
        self._pending = b""
        return data.decode("utf-8", errors="replace")

    def _saw(self, text: str, *tags: str) -> bool:
        self._tail = (self._tail + text)[-(2 * MAX_TAG_CHARS):]
        if any(tag in self._tail for tag in tags):
            self._tail = ""
            return True
        return False

    def accept(self, token: int) -> None:
        """Follow one sampled token."""
        text = self._text(token)
        if self.state == "forcing":
            self.force_at += 1
            if self.force_at >= len(self._forced):
                self.state, self._tail = "done", ""
            return
        if self.state == "done":
            if self._rearm and self._saw(text, self.open):  # another thoughts message: a new budget
                self._enter()
            return
        if self.state == "idle":  # the reply's start (after whitespace): an opening tag, or the answer
            self._tail += text
            start = self._tail.lstrip()
            if start.startswith(self.open):
                self._enter()
            elif not self.open.startswith(start):
                self.state = "done"
                if self._rearm:  # keep the tail: the opening tag may be on its way
                    self._saw("", self.open)
            return
        if self._saw(text, *self.ends):  # the model closed its thoughts itself (or began a call)
            self.state = "done"
            return
        if self.state == "counting":
            self.remaining -= 1
            if self.remaining > 0:
                return
            self.state = "waiting_utf8"
        if not self._pending:  # (never mid-character)
            self._force()
