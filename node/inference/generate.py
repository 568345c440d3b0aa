"""One completion, from validated request to text deltas, on whichever route serves it.

`CompletionRun` is what the API drives:
  prepare()  resolve the model, render + tokenize the prompt, check the context, wait for the
             model (queue_ms), choose the route (sched_ms). Every client error is raised here,
             before any response byte is sent.
  deltas()   async iterator of `Delta`s (text, tool-call pieces, logprobs); sets finish_reason
             and the stop-reason lines.
  close()    cancel what is still running and release the model (always called).
The trace is written here and only here; the API and every other surface read it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from node import const
from node.errors import (
    ContextLengthExceeded,
    EngineError,
    InvalidRequest,
    ModelUnavailable,
    NodeError,
)
from node.inference import constrain, reasoning
from node.inference.handoff import GenerationJob, TokenChannel, batch_scores
from node.inference.logprobs import LogprobTrack
from node.inference.manager import ModelManager
from node.inference.prompting import async_fitted_prompt
from node.inference.request import CompletionRequest, Delta, ToolCall
from node.inference.sampling import SamplingParams
from node.inference.served import ServedModel
from node.inference.textstream import TextAssembler
from node.inference.tools import ToolCallParser, ToolFormat, new_parser, tool_grammar, tools_active
from node.logs import kv
from node.trace import RequestTrace, SegmentTrace

if TYPE_CHECKING:
    from node.inference.pipeline.coordinator import PipelineCoordinator

log = logging.getLogger(__name__)

# A stop sequence that ends the reply within this many tokens "matched almost at once".
EARLY_STOP_TOKENS = 2


class CompletionRun:
    """One request's generation: local (llama.cpp, whole model) or distributed (the pipeline)."""

    def __init__(self, models: ModelManager, request: CompletionRequest, trace: RequestTrace, node_short_id: str,
                 on_first_token: Callable[[RequestTrace], None] | None = None,
                 pipeline: PipelineCoordinator | None = None):
        self.models = models
        self.pipeline = pipeline  # for models this node does not hold whole
        self.pipeline_run: Any | None = None  # the coordinator's run of this request (distributed route)
        self._pipeline_tokens: AsyncIterator[list[int]] | None = None  # its tokens, the first ones taken in prepare()
        self._pipeline_source: AsyncIterator[list[int]] | None = None  # the run's own token generator
        self._on_first_token = on_first_token
        self.request = request
        self.trace = trace
        self.node_short_id = node_short_id
        self.served: ServedModel | None = None
        self.prompt_tokens: list[int] = []
        self.job: GenerationJob | None = None
        self._aborted: NodeError | None = None  # abort(): the error the reply ends with
        self._holding = False
        self._queued = False
        # the model's seats this run takes (local route): OpenAI's `n` takes its n at once in its first
        # choice's run, its other choices none (choices.py; review r54: one each, taken one by one, deadlocked)
        self.seats = 1
        self._gen_future: asyncio.Future | None = None
        self.text = ""  # everything the model wrote
        self.content = ""  # the reply's text outside tool calls (== text when no tools), once deltas() ends
        self.tool_calls: list[ToolCall] = []  # the reply's complete tool calls, once deltas() ends
        # the call max_tokens (or the context) cut short, as far as it was written (its arguments are
        # not valid JSON): the dialects return it, as OpenAI does, never as content
        self.cut_call: ToolCall | None = None
        self.stopped_in_call = False  # a stop sequence matched inside a tool call (cut as the budget cuts)
        self.stop_sequence: str | None = None  # the stop sequence that ended the reply, if one did
        self.timed_out = False  # ended by the request's predict_time_limit_ms
        self._tool_format: ToolFormat | None = None  # set when the reply may call tools
        self.reasoning = ""  # a reasoning model's thoughts, apart from `content`, once deltas() ends
        # a reasoning model's chat: splits its reply (with reasoning_format "none" the thoughts stay content)
        self._thoughts: reasoning.ReasoningSplitter | None = None
        self._answer = ""  # the reply's text outside the thoughts (the tool parser's input)
        self._inline = ""  # reasoning_format "none": the thoughts as written, kept in content
        self._counter: reasoning.ThoughtCounter | None = None  # usage's reasoning_tokens
        self._wrapper: tuple[str, str] | None = None  # an answer's wrapper the prompt opened (prompting.Prompt)

    # --- phase 1: everything that can fail with a client error ---

    def abort(self, error: NodeError) -> None:
        """End this request with `error` (the node is stopping): a generation stops at its next
        token and the client gets the error, in its stream's error event if it streams, rather
        than a connection that ends mid-reply."""
        if self._aborted is None:
            self._aborted = error
        if self.job is not None:
            self.job.cancel.set()

    async def prepare(self) -> None:
        """Resolve, tokenize, check context, queue for the model, assemble the route."""
        if self._aborted is not None:
            raise self._aborted
        served = await self.models.async_get(self.request.model)
        self.served = served
        self.trace.model = served.id
        self.trace.resolved = True
        if served.tokenizer is not None and served.tokenizer.reranker:  # (llama.cpp would answer noise)
            raise InvalidRequest(f"model {served.id} is a reranker: it scores documents on /v1/rerank and "
                                 "writes no text", param="model")
        params = self.request.params
        self.prompt_tokens, fmt = await self._tokenize_prompt(served)
        if fmt is not None:
            params = self._output_grammar(fmt, params)
        tok = served.tokenizer
        loop = asyncio.get_running_loop()
        n_prompt = len(self.prompt_tokens)
        self.trace.prompt_tokens = n_prompt
        if n_prompt == 0:
            raise InvalidRequest("the prompt is empty: nothing to complete",
                                 param=self.request.prompt_param)
        n_ctx = served.n_ctx
        max_tokens = self.request.params.max_tokens
        if n_prompt >= n_ctx:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {n_ctx} tokens. However, your prompt is "
                f"{n_prompt} tokens, which leaves no room for a completion.",
                param=self.request.prompt_param)
        budget = n_ctx - n_prompt
        if max_tokens is not None and max_tokens > budget:
            # the reply gets the room the context has left and ends with finish_reason "length", as
            # llama-server and Ollama do: apps send their own large defaults (Claude Code 32000,
            # others 4096) to models of a few thousand tokens, and a 400 failed every request
            log.debug("DIAG: max_tokens clamped to the context %s", kv(
                request_id=self.trace.request_id, asked=max_tokens, clamped_to=budget, n_ctx=n_ctx, prompt=n_prompt))
            max_tokens = budget
        if max_tokens is None:
            max_tokens = min(budget, const.DEFAULT_MAX_TOKENS) if self.request.kind == "text" else budget
        if params.grammar is None:
            spec = constrain.request_grammar(self.request)
            if spec is not None:
                params = dataclasses.replace(params, grammar=spec)
        params = reasoning.with_budget(params, self._thoughts, self.request.reasoning_budget)
        if params.grammar is not None and self._thoughts is not None:  # room to think before it
            spec = await loop.run_in_executor(None, reasoning.grammar_with_room, self._thoughts, params.grammar, tok)
            params = dataclasses.replace(params, grammar=spec)
        if params.grammar is not None or params.logit_bias:  # compile here: its 400 comes before any byte
            wanted = self.request.response_format  # (its field: llama-server's `grammar`, vLLM's guided_*)
            await loop.run_in_executor(None, constrain.check, tok, params, "tools" if self._tool_format is not None
                                       else wanted.param if wanted is not None else "response_format")
        self.job = GenerationJob(self.trace.request_id, self.prompt_tokens, params, max_tokens)
        if not served.whole:
            await self._prepare_distributed(served)
            await self._await_first_tokens()
            return

        await self.models.async_refuse_failed(served)  # its failed load's reason, before any byte
        if self.seats > served.lock.limit:  # (llama-server: n_cmpl at most its slots)
            raise InvalidRequest(f"`n` is {self.seats}: {served.id} runs at most {served.lock.limit} replies at once "
                                 "on this node (its max_concurrent)", param="n")
        if self.seats:  # (a later choice of `n` is seated already: its queue is not its to join; review r56)
            self.models.admit(served)
            self.models.mark(served, waiting=+1)
            self._queued = True
            log.debug("Queued inference request request_id=%s model=%s waiting=%d", self.trace.request_id,
                      served.id, served.waiting)
            await served.lock.acquire(self.seats)
        self._holding = True
        served.running.add(self.job)
        if self._queued:
            self._queued = False
            self.models.mark(served, waiting=-1)
        self.models.mark(served, busy=True)
        if self._aborted is not None:  # ended while queued (a stop, a forced unload): its 503 before any byte
            raise self._aborted
        self.trace.mark_dequeued()
        started = self.trace.begin_assembly()
        # seed-000 marker (router dispatch), kept word for word
        log.debug("DIAG: dispatch_single starting inference request_id=%s model=%s route=local",
                  self.trace.request_id, served.id)
        self.trace.route = "local"
        self.trace.end_assembly(started, [SegmentTrace(self.node_short_id, 0, served.entry.n_layers, "local")])

    async def _tokenize_prompt(self, served: ServedModel) -> tuple[list[int], ToolFormat | None]:
        """The prompt's tokens (prompting.py) and, for a chat, the model's tool-call format; the
        reasoning splitter and counter kept for the reply."""
        if served.tokenizer is None:  # its vocabulary could not be read: the recorded failure (a 500, not retried)
            raise self.models.unservable(served)
        prompt, fitted, dropped = await async_fitted_prompt(self.request, served.tokenizer, served.n_ctx)
        if dropped:  # Ollama's /api/chat: the oldest messages dropped to fit the context
            log.debug("DIAG: history past the context, oldest messages dropped %s", kv(
                request_id=self.trace.request_id, dropped=dropped, kept=len(fitted.messages),
                prompt=len(prompt.tokens), n_ctx=served.n_ctx))
            self.request = fitted
        if prompt.fmt is not None:
            self._thoughts, self._counter, self._wrapper = prompt.thoughts, prompt.counter, prompt.answer
        return prompt.tokens, prompt.fmt

    async def count_prompt_tokens(self) -> int:
        """Resolve the model and count the prompt's tokens as prepare() would; nothing queues or runs."""
        served = await self.models.async_get(self.request.model)
        self.trace.model = served.id
        tokens, _ = await self._tokenize_prompt(served)
        return len(tokens)

    def _output_grammar(self, fmt: ToolFormat, params: SamplingParams) -> SamplingParams:
        """The one place the reply's grammar is chosen: a tool call's (tool_choice, the format)."""
        request = self.request
        if not tools_active(request):
            return params
        # "required" or a named function: the reply is calls, which response_format does not govern (as
        # at OpenAI; SDK helpers send both); "auto": calls or the response_format's JSON (tool_grammar);
        # "none" hides the tools. Until 2026-12-06 any of them with a response_format was a 400.
        self._tool_format = fmt
        spec = tool_grammar(fmt, request)
        log.debug("DIAG: tool calling request_id=%s format=%s tool_choice=%s tools=%d parallel=%s grammar=%s",
                  self.trace.request_id, fmt.name, request.tool_choice_name or request.tool_choice,
                  len(request.tools), request.parallel_tool_calls, spec["type"] if spec else None)
        return params if spec is None else dataclasses.replace(params, grammar=spec)

    async def _prepare_distributed(self, served: ServedModel) -> None:
        """Plan a chain of segments across this node and its peers (sched_ms); 503 if none covers it."""
        if self.pipeline is None:
            raise ModelUnavailable(f"model {served.id} is held only in slices and the peer network is off")
        self.trace.mark_dequeued()  # nothing to queue for: segments serialise work per slice
        # seed-000 marker (router dispatch), kept word for word
        log.debug("DIAG: dispatch_single starting inference request_id=%s model=%s route=distributed",
                  self.trace.request_id, served.id)
        self.pipeline_run = await self.pipeline.begin(self.job, served.entry, self.trace, served.tokenizer.is_eog)

    async def _await_first_tokens(self) -> None:
        """Distributed route: run the chain to its first tokens before the reply starts, so that a
        failure before any token is the response's status, as on the local route where admission
        comes first: every holder's queue full is a 429 with Retry-After (which the SDKs retry on
        their own), not a stream whose only event is an `overloaded` error."""
        source = self._pipeline_source = self.pipeline_run.tokens()
        try:
            first = await anext(source)
        except StopAsyncIteration:
            first = None
        except NodeError as exc:
            raise self._abort_error(exc) from None

        async def tokens() -> AsyncIterator[list[int]]:
            try:
                if first is not None:
                    yield first
                    try:
                        async for batch in source:
                            yield batch
                    except NodeError as exc:
                        raise self._abort_error(exc) from None
            finally:  # the consumer's aclose (a stop sequence) reaches the run: its normal end, KV kept
                await source.aclose()
        self._pipeline_tokens = tokens()

    def _abort_error(self, exc: NodeError) -> NodeError:
        """The error a chain's run ended with, or this request's abort if it had one (the node
        stops, a forced unload): the client gets the abort's own error."""
        return self._aborted if self._aborted is not None else exc

    # --- phase 2: tokens ---

    async def deltas(self) -> AsyncIterator[Delta]:
        """Deltas of the reply as it is produced; loads the model on demand (counted in ttft)."""
        served, job, trace = self.served, self.job, self.trace
        if served is None or job is None:
            raise RuntimeError("deltas() called before prepare()")
        if self._aborted is not None:
            raise self._aborted
        if self.pipeline_run is not None:
            source = self._pipeline_tokens  # (prepare() took its first tokens)
        else:
            source = await self._local_source()
        tok = served.tokenizer
        # a wrapper the prompt opened ends the reply at its closer (a control token shown for it, as a stop
        # string: Ollama's), reported as the turn's end; the parser starts inside it
        opener, closer = self._wrapper or ("", "")
        # vLLM's min_tokens holds the stop strings back too, until more tokens than that are out (review r53, r57)
        held = job.params.stop if job.params.min_tokens else ()
        assembler = TextAssembler(((*job.params.stop,) if not held else ()) + (closer,))
        track = None if job.params.logprobs is None else LogprobTrack(tok.piece)
        fmt = self._tool_format
        parser = new_parser(fmt, self.request, trace.request_id, opener) if fmt is not None else None
        markers = (frozenset(fmt.special_markers) if fmt is not None else frozenset()) | ({closer} - {""})
        if self._thoughts is not None:  # a thought tag may be a control token (Ministral's [THINK], gpt-oss's <|end|>)
            markers |= set(self._thoughts.markers)
        counter = self._counter
        ended_by_eog = False
        produced = 0
        limit_s = (self.request.predict_time_limit_ms or 0) / 1000
        async for batch in source:
            if self._aborted is not None:
                raise self._aborted
            scores = batch_scores(batch)
            for i, token in enumerate(batch):
                produced += 1
                if tok.is_eog(token):
                    ended_by_eog = True
                    break
                if held and produced > job.params.min_tokens:  # (vLLM: once the output is longer than it)
                    assembler.arm(held)
                    held = ()
                first = trace.first_token is None
                trace.mark_token()
                if first:  # the engine (or the chain's run) set it before the first token
                    trace.cached_tokens = self._cached_tokens()
                if first and self._on_first_token is not None:
                    self._on_first_token(trace)
                if track is not None:
                    if scores is None:
                        raise EngineError("the engine returned no logprobs for a request that asked for them")
                    track.add(token, scores[i], assembler.decoded_chars)
                piece = tok.piece(token)
                if not piece and markers:  # a tool-call marker may be a control token
                    special = tok.special_piece(token)
                    if special in markers:
                        piece = special.encode()
                delta = assembler.feed(piece)
                if counter is not None:  # a token of the thoughts (its tags included)
                    trace.reasoning_tokens += counter.add(piece)
                if assembler.stop_match is not None:
                    job.keep_kv = True  # the reply is complete: its KV serves the next turn
                    job.cancel.set()
                if delta:
                    self.text += delta
                    out = self._split(parser, delta,
                                      () if track is None else track.take(len(assembler.emitted)))
                    if out is not None:
                        yield out
                if assembler.stop_match is not None:
                    break
                if limit_s and b"\n" in piece and self._past_time_limit(limit_s):
                    job.keep_kv = True  # a whole reply, as at a stop sequence
                    job.cancel.set()
                    break
            if ended_by_eog or assembler.stop_match is not None or self.timed_out:
                break
        if self._aborted is not None and not ended_by_eog and assembler.stop_match is None and not self.timed_out:
            raise self._aborted  # the generation stopped because of it, not at its end
        tail = assembler.finish()
        # a stop sequence's tokens are not reported; without one, the last held-back tokens go now
        rest = () if track is None else (track.take(len(assembler.emitted)) if assembler.stop_match else track.rest())
        if tail or rest or self._thoughts is not None:
            self.text += tail
            out = self._split(parser, tail, rest, final=True)
            if out is not None:
                yield out
        if parser is not None:
            # a stop sequence inside a call cuts it as the budget does (the call so far, no markup as content)
            stopped_in_call = assembler.stop_match is not None and parser.in_call
            text, calls = parser.finish(cut=not ended_by_eog and (assembler.stop_match is None or stopped_in_call))
            if text or calls:
                yield Delta(text=text, tool_calls=tuple(calls))
            self.content, self.tool_calls, self.cut_call = self._inline + parser.content, parser.calls, parser.cut_call
            self.stopped_in_call = stopped_in_call and parser.cut_short  # (a whole call before the stop: a call, r79)
        else:
            self.content = self._inline + self._answer
        if self.pipeline_run is not None:
            await source.aclose()
        await self._wait_generation()
        trace.cached_tokens = self._cached_tokens()
        self._finish_reason(ended_by_eog, assembler, produced)
        # (a call the budget cut ends "length"; one a stop sequence cut, named or not, is not to run either)
        if self.tool_calls and not self.stopped_in_call and trace.finish_reason == "stop":
            trace.finish_reason = "tool_calls"

    def _cached_tokens(self) -> int | None:
        """Prompt tokens found in a KV cache: the local engine's, or a chain's kept sessions
        (None on a whole holder's remote generate: not reported)."""
        return self.job.cached_tokens if self.pipeline_run is None else self.pipeline_run.cached_tokens

    def _split(self, parser: ToolCallParser | None, text: str, logprobs: tuple = (),
               final: bool = False) -> Delta | None:
        """A piece of the reply as a Delta: as it is, or thoughts, content and tool-call pieces (with
        the logprobs of the tokens it came from); the tool parser sees only the text after the
        thoughts. `final`: the reply's last piece (the splitter lets go of what it held)."""
        thoughts = inline = ""
        if self._thoughts is not None and self.request.reasoning_format == "none":
            inline, text = self._thoughts.feed_raw(text, final)  # the thoughts as written stay content
            self._inline += inline
        elif self._thoughts is not None:
            thoughts, text = self._thoughts.feed(text) if text else ("", "")
            if final:
                more, rest = self._thoughts.finish()
                thoughts, text = thoughts + more, text + rest
            self.reasoning += thoughts
        self._answer += text
        if parser is None:
            if inline or text or thoughts or logprobs:
                return Delta(text=inline + text, logprobs=logprobs, reasoning=thoughts)
            return None
        content, calls = parser.feed(text) if text else ("", [])  # the answer only: never the thoughts
        if inline or content or calls or logprobs or thoughts:
            return Delta(text=inline + content, tool_calls=tuple(calls), logprobs=logprobs, reasoning=thoughts)
        return None

    async def _local_source(self):
        """Start llama.cpp on the model's executor; returns the token batch iterator."""
        served, job, trace = self.served, self.job, self.trace
        await self.models.async_load_on_demand(served, request_id=trace.request_id)
        await self.models.async_check_file(served)
        engine, tok = served.engine, served.tokenizer
        if engine is None or tok is None:  # unloaded by force between load and here
            # seed-000 marker, kept word for word
            log.debug("DIAG: split stream model not found — model evicted during request model=%s", served.id)
            raise ModelUnavailable(f"model {served.id} was unloaded while the request was starting")
        loop = asyncio.get_running_loop()
        channel = TokenChannel(loop)
        # seed-000 marker, kept word for word; the seed's generate_stream is our engine.generate
        log.debug("DIAG: generate_stream starting request_id=%s prompt_len=%d temperature=%s max_tokens=%d",
                  trace.request_id, len(job.prompt_tokens), job.params.temperature, job.max_new_tokens)
        self._gen_future = asyncio.ensure_future(engine.async_generate(job, channel, tok.is_eog, tok))
        return channel.batches()

    def _past_time_limit(self, limit_s: float) -> bool:
        """llama-server's t_max_predict_ms, asked at a token that writes a newline: past the limit
        since the first token (a code completion ends at a line's end). Until 2026-12-06 any token
        past the limit ended a reply that held a newline anywhere, so one that began with a newline
        (the usual code completion at a line's end) was cut mid-line, at a point the route's speed
        chose (a split model and a whole one gave different text)."""
        first = self.trace.first_token
        if first is None or time.monotonic() - first <= limit_s:
            return False
        self.timed_out = True
        return True

    def _finish_reason(self, ended_by_eog: bool, assembler: TextAssembler, produced: int) -> None:
        trace, job = self.trace, self.job
        assert job is not None
        rid, model = trace.request_id, trace.model
        if assembler.stop_match is not None and assembler.stop_match.sequence not in job.params.stop:
            trace.finish_reason, trace.finish_detail = "stop", "eos"  # an answer's closer (self._wrapper)
        elif assembler.stop_match is not None:
            trace.finish_reason, trace.finish_detail = "stop", "stop_sequence"
            self.stop_sequence = assembler.stop_match.sequence
            if trace.completion_tokens <= EARLY_STOP_TOKENS or not assembler.emitted.strip():
                log.warning("stop sequence in the request matched almost at once request_id=%s model=%s "
                            "stop=%r tokens=%d emitted_chars=%d", rid, model, assembler.stop_match.sequence,
                            trace.completion_tokens, assembler.stop_match.emitted_chars)
        elif ended_by_eog:
            trace.finish_reason, trace.finish_detail = "stop", "eos"
            if trace.completion_tokens == 0:
                log.warning("model ended its turn immediately request_id=%s model=%s prompt_tokens=%d "
                            "(check the chat template and where the prompt ends)", rid, model,
                            len(job.prompt_tokens))
        elif self.timed_out:
            trace.finish_reason, trace.finish_detail = "length", "time_limit"
        else:
            trace.finish_reason = "length"
            at_ctx = len(job.prompt_tokens) + produced >= (self.served.n_ctx if self.served else 0)
            trace.finish_detail = "context" if at_ctx else "max_tokens"
        if not self.text and trace.completion_tokens > 0 and trace.finish_detail not in ("stop_sequence",) \
                and (job.params.max_tokens or 99) > EARLY_STOP_TOKENS:
            log.warning("reply was empty after finalisation request_id=%s model=%s tokens=%d finish=%s",
                        rid, model, trace.completion_tokens, trace.finish_detail)

    async def _wait_generation(self) -> None:
        if self._gen_future is not None:
            try:
                await asyncio.shield(self._gen_future)
            finally:
                self._gen_future = None

    # --- phase 3: always ---

    async def close(self) -> None:
        """Cancel any running generation, wait for the model thread to stop, release the model."""
        if self.job is not None:
            self.job.cancel.set()
        if self.pipeline_run is not None:
            self.pipeline_run.close()
            if self._pipeline_tokens is not None:  # taken from in prepare(), maybe never read (the client went away)
                await self._pipeline_tokens.aclose()  # (a wrapper never started runs no finally:
                await self._pipeline_source.aclose()  # the run's own generator is closed as well)
        try:
            if self._gen_future is not None:
                try:
                    await asyncio.shield(self._gen_future)
                except (NodeError, asyncio.CancelledError):
                    pass
                self._gen_future = None
        finally:
            served = self.served
            if served is not None:
                if self._queued:
                    self._queued = False
                    self.models.mark(served, waiting=-1)
                if self._holding:
                    self._holding = False
                    served.running.discard(self.job)
                    if self.seats:
                        served.lock.release(self.seats)
                    self.models.mark(served, busy=False)
