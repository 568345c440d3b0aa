"""Checks shared by the logprobs tests of both routes."""

from __future__ import annotations

import math


def check_entry(token: str, logprob: float, top: list[tuple[str, float]], n_top: int) -> None:
    """One token's report is a distribution's: ≤ 0, the top sorted and ≤ 1 in total, greedy = its argmax."""
    assert logprob <= 1e-6
    assert len(top) == n_top
    lps = [lp for _t, lp in top]
    assert lps == sorted(lps, reverse=True)
    assert sum(math.exp(lp) for lp in lps) <= 1 + 1e-5
    if n_top:  # greedy: the chosen token is the most likely one
        assert top[0][0] == token and abs(top[0][1] - logprob) <= 1e-6


def chat_entries(logprobs) -> list:
    return list(logprobs.content)
