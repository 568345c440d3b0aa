"""OpenAI's `n`: several choices for one prompt, each its own `CompletionRun`, one request outside.

`ChoicesRun` has a CompletionRun's face (prepare, deltas, close, trace), so the driver and the
stream writer serve it as they serve one run. Inside, choice i is a run of the same request with
n=1 and its own scratch trace (never in the TraceHub; `choice_id`): what the client, the
summary line, headers and metrics see is the request's one trace, which this module fills from the
choices' (prompt tokens once, completion tokens summed, `choices=n`).

- Seeds: choice i samples with seed + i (mod 2**32), so choice i is the reply the same request with
  n=1 and that seed gives (the batch engine's text does not depend on its batch); without a seed
  each choice draws its own. Greedy choices are equal, as OpenAI's.
- The prompt is prefilled once where the route allows it: choice 0 is prepared first (every client
  error is its 400, before any byte), the others then start together; on the local route the batch
  engine lets them wait for choice 0's prefill and start from a copy of its KV (`GenerationJob.
  group`, batch_engine); on a chain the prefix reuse of the coordinator's kept sessions does it.
- Deltas carry their choice's index, and a last `ended` delta per choice (its finish reason is on
  its run's trace). A choice that fails ends the request (the others are cancelled); close() stops
  every choice and frees their sequences, whether the client went away or the reply is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

from node.inference.generate import CompletionRun
from node.inference.request import CompletionRequest, Delta, TokenLogprob
from node.trace import RequestTrace

log = logging.getLogger(__name__)

_DONE = object()  # a choice's pump has nothing more


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed choice `index` samples with: the request's + index (None: each draws its own)."""
    return None if seed is None else (seed + index) % 2**32


def choice_id(request_id: str, index: int) -> str:
    """The id choice `index` runs under (its log lines, its chain sessions: two choices in one chain
    session id wrote into each other's KV): the request's, and `-c<index>` after it but for choice 0."""
    return request_id if index == 0 else f"{request_id}-c{index}"


def choice_request(request: CompletionRequest, index: int) -> CompletionRequest:
    """Choice `index` as a request of its own (n=1, its seed)."""
    params = dataclasses.replace(request.params, seed=choice_seed(request.params.seed, index))
    return dataclasses.replace(request, n=1, params=params)


class ChoicesRun:
    """The `n` choices of one completion request (see the module docstring)."""

    def __init__(self, request: CompletionRequest, trace: RequestTrace,
                 new_run: Callable[[CompletionRequest, RequestTrace], CompletionRun],
                 on_first_token: Callable[[RequestTrace], None] | None = None):
        self.request = request
        self.trace = trace
        trace.choices = request.n
        self._on_first_token = on_first_token
        self.runs: list[CompletionRun] = []
        for i in range(request.n):
            scratch = RequestTrace(model=trace.model, operation=trace.operation, request_id=choice_id(trace.request_id, i),
                                   stream=trace.stream, created_at=trace.created_at, admitted=trace.admitted)
            run = new_run(choice_request(request, i), scratch)
            run.seats = request.n if i == 0 else 0  # (the local route's seats, all taken at once by choice 0)
            self.runs.append(run)
        # each choice's logprobs as the reply shows them (the driver collects them: it knows what a
        # dialect leaves out)
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in self.runs]
        self._tasks: list[asyncio.Task] = []

    @property
    def served(self):
        return self.runs[0].served

    async def prepare(self) -> None:
        """Choice 0's prepare: the model, the prompt, the context, every choice's seat (the local route:
        n at once, as llama-server starts n_cmpl's slots; n above the model's seats is the 400; its
        errors are the request's, before any byte). The others prepare in deltas(), seated already."""
        first = self.runs[0]
        await first.prepare()
        self._copy_route(first.trace)
        group = self.trace.request_id
        if first.job is not None:
            first.job.group = group

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every choice's deltas as they come, each tagged with its index, then an `ended` one."""
        queue: asyncio.Queue = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._pump(i, run, queue), name=f"choice-{i}")
                       for i, run in enumerate(self.runs)]
        left = len(self._tasks)
        while left:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is _DONE:
                left -= 1
                self._gather()
                self.runs[index].trace.finished = time.monotonic()
                yield Delta(choice=index, ended=True)
                continue
            self._gather()
            yield dataclasses.replace(item, choice=index)
        self._gather()

    async def _pump(self, index: int, run: CompletionRun, queue: asyncio.Queue) -> None:
        try:
            if index:
                await run.prepare()
                if run.job is not None:  # the engine starts it from choice 0's prefilled prompt
                    run.job.group = self.trace.request_id
            async for delta in run.deltas():
                queue.put_nowait((index, delta))
            queue.put_nowait((index, _DONE))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the request ends with it (deltas() raises it)
            queue.put_nowait((index, exc))

    def _copy_route(self, child: RequestTrace) -> None:
        """The route as choice 0's prepare found it (the stream's headers go out with it)."""
        trace = self.trace
        trace.model, trace.resolved = child.model, child.resolved
        trace.route, trace.segments, trace.regions = child.route, child.segments, child.regions
        trace.dequeued, trace.assembled = child.dequeued, child.assembled
        trace.sched_s, trace.assemblies = child.sched_s, child.assemblies
        trace.prompt_tokens = child.prompt_tokens

    def _gather(self) -> None:
        """The request's trace from its choices': the prompt counted once, the tokens summed, choice
        0's finish and route; the first token is the first of any choice."""
        trace, kids = self.trace, [run.trace for run in self.runs]
        first = [t.first_token for t in kids if t.first_token is not None]
        if first and trace.first_token is None:
            trace.first_token = min(first)
            if self._on_first_token is not None:
                self._on_first_token(trace)
        self._copy_route(kids[0])
        # choices that went different ways (one failed over to other peers): the line said choice
        # 0's route alone (2026-12-07); each routed choice's now, and every choice's retries counted
        routes = [(t.route, t.node_ids) for t in kids if t.route is not None]
        trace.choice_routes = routes if any(r != routes[0] for r in routes) else []
        trace.assemblies = kids[0].assemblies + sum(max(0, t.assemblies - 1) for t in kids[1:])
        trace.cached_tokens = kids[0].cached_tokens
        trace.completion_tokens = sum(t.completion_tokens for t in kids)
        # they decode side by side, one token each a step: the decode time is the longest one's
        trace.longest_choice_tokens = max(t.completion_tokens for t in kids)
        trace.reasoning_tokens = sum(t.reasoning_tokens for t in kids)
        trace.finish_reason, trace.finish_detail = kids[0].finish_reason, kids[0].finish_detail
        trace.failure_causes = [cause for t in kids for cause in t.failure_causes]
        trace.first_attempt_cause = next((t.first_attempt_cause for t in kids if t.first_attempt_cause), None)

    def abort(self, error) -> None:
        """End every choice with `error` (the node stops)."""
        for run in self.runs:
            run.abort(error)

    async def close(self) -> None:
        """Stop every choice (the client went away, one failed, or all are done) and release them."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            for run in self.runs:
                if run.job is not None:
                    run.job.cancel.set()  # every choice stops at its next token, together
            for run in reversed(self.runs):  # choice 0, which holds every choice's seat, last
                await run.close()
        finally:
            self._gather()
