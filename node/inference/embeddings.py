"""One /v1/embeddings request: resolve the model, tokenize, check, wait for the model, embed.

Embeddings need the model whole on this node (llama.cpp in embedding mode): a model held here only
as slices, or only by the swarm, is refused with a 409. The work goes through the model's lock,
like a completion (its wait is the trace's queue_ms), and runs on the model's executor.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from node.errors import Conflict, ContextLengthExceeded, InvalidRequest, ModelUnavailable
from node.inference.embedder import embed_limit
from node.inference.manager import ModelManager, ServedModel
from node.trace import RequestTrace, SegmentTrace

log = logging.getLogger(__name__)

MAX_INPUTS = 2048  # OpenAI's limit on the number of inputs in one request
# inputs are embedded in runs of about this many tokens, one executor call each: the model's thread
# also runs the completions' batch loop, which then gets it between two runs (a completion waits
# for one run, not for every input of an app's indexing request)
EMBED_RUN_TOKENS = 256


@dataclass
class EmbeddingRequest:
    """A validated embeddings request: each input is a string or a list of token ids."""

    model: str
    inputs: list[str | list[int]]
    encoding_format: str = "float"  # float | base64
    dimensions: int | None = None


@dataclass
class EmbeddingResult:
    """One vector per input, in input order, and the tokens they took."""

    model: str
    vectors: list[list[float]]
    prompt_tokens: int


def _param(request: EmbeddingRequest, i: int) -> str:
    return "input" if len(request.inputs) == 1 else f"input[{i}]"


async def run_embeddings(models: ModelManager, request: EmbeddingRequest, trace: RequestTrace,
                         node_short_id: str) -> EmbeddingResult:
    """Embed every input with the model's embedding context; client errors are raised before any work."""
    served = await models.async_get(request.model)
    trace.model, trace.resolved = served.id, True
    if not served.whole:
        where = "as slices only" if served.state == "slices" else "only by peers in the swarm"
        raise Conflict(f"model {served.id} is held on this node {where}; embeddings need the model whole on "
                       "this node", param="model")
    tok = served.tokenizer
    if tok is None:
        raise ModelUnavailable(f"model {served.id} cannot be served: {served.error}")
    texts = [(i, text) for i, text in enumerate(request.inputs) if isinstance(text, str)]
    tokenized = await asyncio.get_running_loop().run_in_executor(
        None, lambda: [tok.tokenize(text) for _, text in texts])
    token_lists: list[list[int]] = [t if not isinstance(t, str) else [] for t in request.inputs]
    for (i, _), tokens in zip(texts, tokenized, strict=True):
        token_lists[i] = tokens
    limit = embed_limit(served.n_ctx)
    for i, tokens in enumerate(token_lists):
        if not tokens:
            raise InvalidRequest(f"`{_param(request, i)}` gives no tokens: nothing to embed", param="input")
        if len(tokens) > limit:
            what = "context length" if limit == served.n_ctx else "input length for embeddings"
            raise ContextLengthExceeded(
                f"This model's maximum {what} is {limit} tokens. However, `{_param(request, i)}` "
                f"is {len(tokens)} tokens. Please reduce the input.", param="input")
        bad = next((t for t in tokens if not 0 <= t < tok.n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"`{_param(request, i)}` holds token id {bad}, outside the model's vocabulary "
                                 f"(0..{tok.n_vocab - 1})", param="input")
    total = sum(len(tokens) for tokens in token_lists)
    trace.prompt_tokens = total
    vectors = await _embed_whole(models, served, token_lists, request, trace, node_short_id)
    return EmbeddingResult(served.id, vectors, total)


async def _embed_whole(models: ModelManager, served: ServedModel, token_lists: list[list[int]],
                       request: EmbeddingRequest, trace: RequestTrace, node_short_id: str) -> list[list[float]]:
    models.admit(served)
    models.mark(served, waiting=+1)
    queued, holding = True, False
    try:
        await served.lock.acquire()
        holding, queued = True, False
        models.mark(served, waiting=-1, busy=True)
        trace.mark_dequeued()
        started = trace.begin_assembly()
        trace.route = "local"
        trace.end_assembly(started, [SegmentTrace(node_short_id, 0, served.entry.n_layers, "local")])
        if served.state != "loaded":
            log.info("On-demand loading: model is on disk but not loaded request_id=%s model=%s",
                     trace.request_id, served.id)
            await models.async_load(served.id)
        await models.async_check_file(served)
        engine = served.engine
        if engine is None:
            raise ModelUnavailable(f"model {served.id} was unloaded while the request was starting")
        n_embd = await engine.async_run(engine.n_embd)
        if request.dimensions is not None and request.dimensions != n_embd:
            raise InvalidRequest(f"`dimensions` {request.dimensions} is not supported: model {served.id} gives "
                                 f"vectors of {n_embd} dimensions only", param="dimensions")
        vectors: list[list[float]] = []
        for run in _runs(token_lists, EMBED_RUN_TOKENS):
            vectors.extend(await engine.async_run(engine.embed, run))
        return vectors
    finally:
        if queued:
            models.mark(served, waiting=-1)
        if holding:
            served.lock.release()
            models.mark(served, busy=False)


def _runs(token_lists: list[list[int]], tokens: int) -> list[list[list[int]]]:
    """The inputs in order, in runs of at most `tokens` tokens (an input longer than that alone)."""
    runs: list[list[list[int]]] = []
    size = 0
    for item in token_lists:
        if not runs or size + len(item) > tokens:
            runs.append([])
            size = 0
        runs[-1].append(item)
        size += len(item)
    return runs
