"""OpenAI's `n` in the reply: a body with a choice per run, and a stream whose chunks carry each
choice's index (node.inference.choices runs them; openai.ChatDialect picks these for n > 1).

A stream interleaves the choices' chunks as their tokens come; a choice's finish chunk goes out when
it ends, with its own finish_reason; the last one to end rides on the closing events, as one run's
does (its timings when usage was not asked), then the usage chunk (the prompt once, every choice's
tokens) and [DONE].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from node.api.responses import DONE_EVENT, StreamChunks, choice_json, choices_body
from node.errors import NodeError
from node.inference.choices import ChoicesRun
from node.inference.request import CompletionRequest, Delta, TokenLogprob


def body(completion: CompletionRequest, run: ChoicesRun, logprobs: Sequence[Sequence[TokenLogprob]],
         hide_reasoning: bool) -> dict[str, Any]:
    """The whole reply: choice i from run i (its text, tool calls as a stream sent them, finish)."""
    choices = []
    for i, one in enumerate(run.runs):
        calls = [*one.tool_calls, one.cut_call] if one.cut_call is not None else one.tool_calls
        choices.append(choice_json(completion, i, one.trace.finish_reason, one.content,
                                   logprobs[i] if i < len(logprobs) else (), calls,
                                   "" if hide_reasoning else one.reasoning))
    return choices_body(completion, run.trace, choices)


class ChoicesChunks:
    """The streaming.StreamEvents of a reply of several choices (see the module docstring)."""

    def __init__(self, completion: CompletionRequest, run: ChoicesRun, *, hide_reasoning: bool = False):
        self._run = run
        self._include_usage = completion.include_usage
        self._parts = [StreamChunks(completion, run.trace, hide_reasoning=hide_reasoning, index=i)
                       for i in range(len(run.runs))]
        self._open = len(self._parts)  # choices not ended yet
        self._last: int | None = None  # the last choice to end: its finish chunk closes the stream

    def opening(self) -> list[bytes]:
        return []

    def delta(self, delta: Delta) -> list[bytes]:
        i = delta.choice
        if not delta.ended:
            return self._parts[i].delta(delta)
        self._open -= 1
        if not self._open:
            self._last = i
            return []
        return self._parts[i].finish(self._run.runs[i].trace.finish_reason)

    def closing(self) -> list[bytes]:
        trace = self._run.trace
        last = self._last if self._last is not None else 0
        finish = self._run.runs[last].trace.finish_reason
        if self._include_usage:
            return [*self._parts[last].finish(finish), self._parts[last].usage_event(), DONE_EVENT]
        return [*self._parts[last].finish(finish, x_swarm=trace.timings()), DONE_EVENT]

    def error(self, exc: NodeError) -> list[bytes]:
        return self._parts[0].error(exc)
