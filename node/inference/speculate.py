"""N-gram speculation (prompt lookup): draft tokens from the request's own context, no draft model.

`NgramDrafter` keeps the context (prompt + generated) and an index of where every n-gram
(n = 1..max_n) last occurred. Each round it looks for the longest n-gram ending the context that
occurred earlier (n from max_n down to 1) and drafts the up to k tokens that followed that earlier
occurrence. The engine verifies the draft in one forward (sample at every position, keep the
draft while the model's own token agrees) and reports back with `observe`.

k adapts: it doubles on a fully accepted draft (up to max_k), shrinks to what was accepted plus
one on a partial one, and a draft the model rejects outright pauses drafting for 1, 2, 4 ... up to
MAX_PAUSE_ROUNDS rounds (consecutive misses double it; any acceptance resets it), so prose, which
has nothing to copy, costs almost nothing. Pure Python, no I/O: the engines own the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX_N = 3
START_K = 4  # first draft length; grows by doubling on full acceptance
MAX_PAUSE_ROUNDS = 16  # the longest backoff after consecutive rejected drafts


@dataclass
class SpeculationStats:
    """One request's figures, as the seed-000 summary line gives them."""

    rounds: int = 0  # decode rounds (one forward each), with or without a draft
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens the model agreed with
    paused_rounds: int = 0  # rounds the backoff suppressed drafting

    @property
    def tokens_per_round(self) -> float:
        """Tokens each round produced: its accepted drafts plus the model's own token."""
        return (self.rounds + self.accepted) / self.rounds if self.rounds else 0.0

    def as_kv(self) -> dict[str, object]:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "paused_rounds": self.paused_rounds, "tokens_per_round": round(self.tokens_per_round, 2)}


class NgramDrafter:
    """Drafts up to k tokens per round from the longest matching n-gram of its context."""

    def __init__(self, context: list[int] | tuple[int, ...] = (), *, max_k: int = 8, max_n: int = DEFAULT_MAX_N,
                 stats: SpeculationStats | None = None):
        """`stats`: where to count (a request's drafters over several attempts share one)."""
        if max_k < 1 or max_n < 1:
            raise ValueError(f"max_k and max_n must be >= 1, got {max_k} and {max_n}")
        self.max_k, self.max_n = max_k, max_n
        self.k = min(START_K, max_k)
        self.tokens: list[int] = []
        # n -> {n-gram: index of the token that followed its latest occurrence}
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self._pause = 0  # rounds left to skip
        self._next_pause = 1  # how long the next miss pauses
        self.stats = stats if stats is not None else SpeculationStats()
        self.extend(context)

    def extend(self, tokens) -> None:
        """Append tokens to the context (the accepted ones only)."""
        for token in tokens:
            end = len(self.tokens)  # index of `token`: it follows the n-grams ending just before it
            self.tokens.append(int(token))
            for n in range(1, min(self.max_n, end) + 1):
                self._index[n][tuple(self.tokens[end - n:end])] = end

    def lookup(self, k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the longest n-gram ending the
        context (the copy continuing over itself when that occurrence is recent); [] when none occurred."""
        toks, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, size), 0, -1):
            at = self._index[n].get(tuple(toks[size - n:]))
            if at is not None:  # at < size always: the suffix itself is indexed only once its successor exists
                draft = toks[at:at + k]
                # a recent match (periodic text: "a b a b a") runs into the draft itself: the copy
                # goes on over what it just drafted, as an overlapping LZ77 copy does
                while len(draft) < k:
                    draft.append(draft[len(draft) - (size - at)])
                return draft
        return []

    def draft(self) -> list[int]:
        """This round's draft (possibly empty); counts the round."""
        self.stats.rounds += 1
        if self._pause > 0:
            self._pause -= 1
            self.stats.paused_rounds += 1
            return []
        return self.lookup(self.k)

    def observe(self, drafted: int, accepted: int) -> None:
        """How the model took this round's draft: adapt k and the backoff."""
        if drafted <= 0:
            return
        self.stats.drafted += drafted
        self.stats.accepted += accepted
        if accepted >= drafted:
            self.k = min(self.max_k, max(self.k, drafted) * 2)
            self._next_pause = 1
        elif accepted > 0:
            self.k = max(1, min(self.max_k, accepted + 1))
            self._next_pause = 1
        else:
            self._pause = self._next_pause
            self._next_pause = min(MAX_PAUSE_ROUNDS, self._next_pause * 2)
            self.k = max(1, min(self.k, START_K))


def speculation_off_reason(params) -> str | None:
    """Why a request does not speculate (its SamplingParams), or None.

    Only greedy requests speculate. llama.cpp computes a sequence's rows of one batch with other
    kernels than one row alone (several query rows per sequence in attention): on the default
    model a verify row's logits differ from a lone decode's by up to 0.08, which moves a sampled
    request's draws (its text for a seed would depend on what was drafted) while greedy text
    changes only at an exact near-tie. A grammar, a logit_bias, a thinking budget, logprobs and
    ignore_eos follow every sampled token, which the verify loops do not replay."""
    if not params.greedy:
        return "sampling"
    if params.grammar is not None:
        return "grammar"
    if params.logit_bias:
        return "logit_bias"
    if params.reasoning_budget is not None:
        return "reasoning_budget"
    if params.logprobs is not None:
        return "logprobs"
    if params.ignore_eos or params.min_tokens:
        return "ignore_eos"
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share (also the prefix caches' measure of reuse)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def accept_count(draft: list[int], produced: list[int]) -> int:
    """How many draft tokens the verified `produced` tokens confirm (produced[i] is the model's
    token after draft[:i]; it confirms draft[i] when equal)."""
    return common_prefix(draft, produced)
