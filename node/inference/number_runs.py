"""JSON numbers of bounded length in constrained decoding: a weak model otherwise writes
"0.3333333333…", "1.0000000…" or "1e99999…" until max_tokens, and the reply is cut JSON that no
client parses (instructor, pydantic-ai, LangChain). llama.cpp's json-schema-to-grammar bounds every
number (`integral-part`, `decimal-part`); llguidance's JSON compiler has no such option, and a schema
rewrite cannot say it (`multipleOf` and a range both forbid exponents, and `multipleOf` below 1e-10
does not compile; measured 2026-12-07). So the bound is a mask over the grammar's: past a digit run's
bound the tokens that would lengthen it are banned, while the grammar's own mask says the text is a
JSON number (after its digits it allows no `"` and no letter but e/E), and only where something else
stays allowed (a `const`/`enum` number is written whole).

Bounds: a fraction 16 digits (llama.cpp's decimal-part: with an exponent, 17 significant digits
write any double exactly); an integral part 19 (the integers' bound, schema_bounds.py: the mask cannot
tell an integer from a number, and a 19-digit id stays writable; llama.cpp: 16); an exponent 3 digits
(every double's, 1e-324 to 1e308; llama.cpp's 16 only add infinities and zeros). Only for grammars
whose JSON is ours: a client's regex or GBNF grammar in the spec turns it off (its digits are its own).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from node.inference.tokenizer import ModelTokenizer

INTEGRAL_DIGITS = 19  # as MAX_INTEGER (node.inference.schema_bounds)
FRACTION_DIGITS = 16  # llama.cpp's decimal-part
EXPONENT_DIGITS = 3  # every double's exponent (llama.cpp: 16, its integral-part)
_TAIL = 96  # bytes of output kept: more than a bounded number's 55
# the number the output ends with, each part as far as written
_NUMBER = re.compile(rb"(?:^|[^0-9A-Za-z_.+\-])-?([0-9]+)(\.([0-9]*))?([eE][+-]?([0-9]*))?$")
_DIGITS = b"0123456789"


def spec_has_our_json(spec: Any) -> bool:
    """The spec has a JSON node and no regex or GBNF a client gave (node.inference.grammar)."""
    kinds: set[str] = set()

    def walk(s: Any) -> None:
        if isinstance(s, dict):
            kinds.add(s.get("type"))
            for item in s.get("items") or ():
                walk(item)
            walk(s.get("item"))

    walk(spec)
    return "json" in kinds and not kinds & {"regex", "gbnf"}


class DigitTable:
    """Per vocabulary: each token's leading ASCII digits, and the tokens that cannot follow a JSON
    number's digit (they start with `"` or a letter other than e/E)."""

    def __init__(self, tok: ModelTokenizer):
        pieces = [tok.piece(i) for i in range(tok.n_vocab)]
        self.lead = np.array([len(p) - len(p.lstrip(_DIGITS)) for p in pieces], dtype=np.int32)
        self.max_lead = int(self.lead.max(initial=0))
        self.not_number = np.array([bool(p) and (p[:1] == b'"' or (p[:1].isalpha() and p[:1] not in b"eE"))
                                    for p in pieces], dtype=bool)


_table_lock = threading.Lock()


def digit_table(owner: Any, tok: ModelTokenizer) -> DigitTable:
    """The DigitTable of a vocabulary (built once, blocking; kept on `owner`, its Vocabulary)."""
    with _table_lock:
        table = getattr(owner, "digit_table", None)
        if table is None:
            table = owner.digit_table = DigitTable(tok)
        return table


class NumberRuns:
    """One generation's guard: follows the output's last bytes and bans what would lengthen a
    JSON number's digit run past its bound."""

    def __init__(self, table: DigitTable, piece: Callable[[int], bytes]):
        self.table = table
        self._piece = piece
        self.tail = b""

    def accept(self, token: int) -> None:
        """Follow the token the generation took."""
        self.tail = (self.tail + self._piece(token))[-_TAIL:]

    def room(self) -> int | None:
        """Digits the run the output ends with may still take, or None (not in a number)."""
        m = _NUMBER.search(self.tail)
        if m is None:
            return None
        if m.group(4) is not None:
            return EXPONENT_DIGITS - len(m.group(5))
        if m.group(2) is not None:
            return FRACTION_DIGITS - len(m.group(3))
        return INTEGRAL_DIGITS - len(m.group(1))

    def limit(self, allowed: np.ndarray) -> None:
        """Ban in `allowed` (the grammar's mask, in place) the tokens that would run a JSON number's
        digits past the bound."""
        table = self.table
        if not self.tail[-1:].isdigit() and self.tail[-1:] not in (b".", b"e", b"E", b"+", b"-"):
            return
        room = self.room()
        if room is None or table.max_lead <= room:
            return
        over = allowed & (table.lead > max(room, 0))
        if not over.any() or (allowed & table.not_number).any():  # (a string, free text: not a number)
            return
        rest = allowed & ~over
        if rest.any():  # (a const or enum number: its digits are forced)
            np.copyto(allowed, rest)
