"""JSON numbers of bounded length in constrained decoding: a weak model otherwise writes
"0.3333333333…", "1.0000000…" or "1e99999…" until max_tokens, and the reply is cut JSON that no
client parses (instructor, pydantic-ai, LangChain). llama.cpp's json-schema-to-grammar bounds every
number (`integral-part`, `decimal-part`); llguidance's JSON compiler has no such option, and a schema
rewrite cannot say it (`multipleOf` and a range both forbid exponents, and `multipleOf` below 1e-10
does not compile; measured 2026-12-07). So the bound is a mask over the grammar's: past a digit run's
bound the tokens that would lengthen it are banned, while the grammar's own mask says the text is a
JSON number (every token it allows starts with a byte a number's digit may be followed by: a digit,
`.`, `e`/`E`, `+`/`-`, `,`, `}`, `]`, whitespace, `<` a tool format's closer; and after a digit one
of them may end the digits or start an exponent), only where something else stays allowed, and only
where the grammar would take the digit run on (32 more zeros): a `const`/`enum` number, a literal
and most string patterns keep their digits (not one whose digits are followed by a byte a number may
be followed by, `^[0-9]+,[0-9]+$`: the mask does not track whether it is inside a string).

Bounds: a fraction 16 digits (llama.cpp's decimal-part: with an exponent, 17 significant digits
write any double exactly); an integral part 19 (the integers' bound, schema_bounds.py: the mask cannot
tell an integer from a number, and a 19-digit id stays writable; llama.cpp: 16); an exponent 3 digits
(every double's, 1e-324 to 1e308; llama.cpp's 16 only add infinities and zeros). Where no exponent
may follow (a range: llguidance allows none), a number below 1 has 17 fraction digits after its
first 323 zeros (0.00000000000000001 and 5e-324 have no other way). Only for grammars
whose JSON is ours: a client's regex or GBNF grammar in the spec turns it off (its digits are its own).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from node.inference import grammar as g

if TYPE_CHECKING:
    from node.inference.tokenizer import ModelTokenizer

INTEGRAL_DIGITS = 19  # as MAX_INTEGER (node.inference.schema_bounds)
FRACTION_DIGITS = 16  # llama.cpp's decimal-part
EXPONENT_DIGITS = 3  # every double's exponent (llama.cpp: 16, its integral-part)
LEADING_ZEROS = 323  # a fraction's leading zeros not counted where no exponent may be written (a
# range) and the number is below 1: 0.(323 zeros)5 is the least double, 5e-324
_TAIL = 384  # bytes of output kept: more than a bounded number's 342
# the number the output ends with (after the last byte no number holds), each part as far as written
_NUMBER = re.compile(rb"-?([0-9]+)(\.([0-9]*))?([eE][+-]?([0-9]*))?")
_IN_NUMBER = b"0123456789.eE+-"
_DIGITS = b"0123456789"
_FOLLOW = b"0123456789.eE+-,}] \t\n\r<"  # the bytes that may follow a JSON number's digit
_ENDS = b",}] \t\n\r<eE"  # of them, those that end its digits (or start its exponent)
_RUN_ON = 32  # zeros the grammar takes after a digit run it leaves unbounded


def spec_has_our_json(spec: g.Spec) -> bool:
    """The spec has a JSON node and no regex or GBNF a client gave (node.inference.grammar)."""
    found = g.kinds(spec)
    return "json" in found and not found & {"regex", "gbnf"}


class DigitTable:
    """Per vocabulary: each token's leading ASCII digits, the tokens that cannot follow a JSON number's
    digit (they start with another byte than `_FOLLOW`'s), those that end its digits (`_ENDS`, or an
    end-of-generation token) and the token "0"."""

    def __init__(self, tok: ModelTokenizer):
        pieces = [tok.piece(i) for i in range(tok.n_vocab)]
        eog = np.zeros(tok.n_vocab, dtype=bool)
        eog[list(tok.eog_ids())] = True
        self.lead = np.array([len(p) - len(p.lstrip(_DIGITS)) for p in pieces], dtype=np.int32)
        self.max_lead = int(self.lead.max(initial=0))
        self.not_number = np.array([bool(p) and p[0] not in _FOLLOW for p in pieces], dtype=bool) & ~eog
        self.ends = np.array([bool(p) and p[0] in _ENDS for p in pieces], dtype=bool) | eog
        self.exponent = np.array([p[:1] in (b"e", b"E") for p in pieces], dtype=bool)
        self.zero = pieces.index(b"0") if b"0" in pieces else None


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

    def __init__(self, table: DigitTable, piece: Callable[[int], bytes],
                 takes: Callable[[list[int]], int] | None = None):
        """`takes`: how many of these tokens the grammar would take from here (its matcher's
        validate_tokens; it consumes none)."""
        self.table = table
        self._piece = piece
        self._takes = takes
        self.tail = b""

    def accept(self, token: int) -> None:
        """Follow the token the generation took."""
        self.tail = (self.tail + self._piece(token))[-_TAIL:]

    def room(self, exponent: bool = True) -> int | None:
        """Digits the run the output ends with may still take, or None (not in a number). `exponent`:
        one may follow; where none may (a range), the fraction of a number below 1 counts 17 digits
        after its first LEADING_ZEROS zeros (0.00000000000000001 has no other way)."""
        tail = self.tail
        start = len(tail.rstrip(_IN_NUMBER))
        if start and (tail[start - 1:start].isalpha() or tail[start - 1:start] == b"_"):
            return None  # (a word's digits: "abc1", "x_2")
        m = _NUMBER.fullmatch(tail, start)
        if m is None:
            return None
        if m.group(4) is not None:
            return EXPONENT_DIGITS - len(m.group(5))
        if m.group(2) is not None:
            fraction = m.group(3)
            zeros = len(fraction) - len(fraction.lstrip(b"0"))
            if exponent or m.group(1).strip(b"0"):
                return FRACTION_DIGITS - len(fraction)
            significant = FRACTION_DIGITS + 1  # (as 1 digit and a 16-digit fraction: 0.30000000000000004)
            return significant - (len(fraction) - min(zeros, LEADING_ZEROS))
        return INTEGRAL_DIGITS - len(m.group(1))

    def limit(self, allowed: np.ndarray) -> None:
        """Ban in `allowed` (the grammar's mask, in place) the tokens that would run a JSON number's
        digits past the bound."""
        table = self.table
        last = self.tail[-1:]
        if not last.isdigit() and last not in (b".", b"e", b"E", b"+", b"-"):
            return
        room = self.room(exponent=bool((allowed & table.exponent).any()))
        if room is None or table.max_lead <= room:
            return
        over = allowed & (table.lead > max(room, 0))
        if not over.any() or (allowed & table.not_number).any():  # (a string, a key, free text)
            return
        if last.isdigit() and not (allowed & table.ends).any():  # (a pattern's digits: "12.50", "1/2")
            return
        rest = allowed & ~over
        if not rest.any():  # (nothing else: a const or enum number's digits, an end that is banned)
            return
        zero = table.zero
        if self._takes is not None and zero is not None and self._takes([zero] * _RUN_ON) < _RUN_ON:
            return  # (the run ends of itself: a const, an enum's longer member, a literal)
        np.copyto(allowed, rest)
