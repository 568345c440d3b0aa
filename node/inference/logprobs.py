"""Logprobs: computing them from a row of logits (numpy, on llama.cpp's thread), and lining them
up with the text a run emits (on the loop).

What they are of: the model's own distribution, the log-softmax of the raw logits at the sampled
position, before penalties, logit bias, a grammar mask, temperature or top-k/p (as OpenAI reports
them, and as llama-cpp-python's `create_completion(logprobs=n)` does). The torch twin for the
last segment of a chain is `pipeline.sampler.Sampler.scores`.

Which tokens are reported: those whose text starts inside the text actually sent to the client.
The text assembler holds back bytes (an incomplete UTF-8 character, a possible stop sequence); a
token's logprob goes out with the delta that carries the start of its text, the tokens after a
matched stop sequence's start are never reported, and the end-of-generation token is not either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from node.inference.handoff import TokenScores
from node.inference.request import TokenLogprob

# What an impossible token (logit -inf) is reported as: JSON has no -Infinity (OpenAI uses the same)
LOGPROB_FLOOR = -9999.0


def scores_from_logits(row: np.ndarray, token: int, n_top: int) -> TokenScores:
    """The chosen token's logprob and the `n_top` most likely tokens of one row of logits [V]."""
    row = np.asarray(row, dtype=np.float32)
    peak = float(row.max())
    lse = peak + float(np.log(np.exp(row - peak).sum(dtype=np.float64)))
    chosen = float(row[token]) - lse
    if n_top <= 0:
        return TokenScores(chosen)
    n_top = min(n_top, row.shape[0])
    ids = np.argpartition(row, -n_top)[-n_top:]
    ids = ids[np.argsort(-row[ids], kind="stable")]
    return TokenScores(chosen, tuple(int(i) for i in ids), tuple(float(row[i]) - lse for i in ids))


def _floor(value: float) -> float:
    return value if value >= LOGPROB_FLOOR else LOGPROB_FLOOR  # also maps NaN to the floor


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def to_token_logprob(piece, token: int, scores: TokenScores, text_offset: int) -> TokenLogprob:
    """Ids → text with `piece(id) -> bytes` (the tokenizer's); logprobs floored for JSON."""
    chosen = piece(token)
    top = tuple((_text(b), b, _floor(lp)) for b, lp in
                ((piece(i), lp) for i, lp in zip(scores.top_ids, scores.top_logprobs, strict=True)))
    return TokenLogprob(_text(chosen), chosen, _floor(scores.logprob), top, text_offset)


@dataclass
class LogprobTrack:
    """The tokens of a run whose logprobs are not sent yet, each with where its text starts."""

    piece: object  # the tokenizer's piece(id) -> bytes

    def __post_init__(self) -> None:
        self._pending: list[TokenLogprob] = []

    def add(self, token: int, scores: TokenScores, text_offset: int) -> None:
        """A generated token (not the end of generation), its text starting at `text_offset` chars."""
        self._pending.append(to_token_logprob(self.piece, token, scores, text_offset))

    def take(self, emitted_chars: int) -> tuple[TokenLogprob, ...]:
        """The pending tokens whose text starts before `emitted_chars` (the text sent so far)."""
        n = 0
        while n < len(self._pending) and self._pending[n].text_offset < emitted_chars:
            n += 1
        out, self._pending = tuple(self._pending[:n]), self._pending[n:]
        return out

    def rest(self) -> tuple[TokenLogprob, ...]:
        """Everything pending (the end of a reply without a stop sequence)."""
        out, self._pending = tuple(self._pending), []
        return out
