"""One /v1/embeddings request: resolve the model, tokenize, check, wait for the model, embed.

A model held whole here runs on this node's llama.cpp (embedding mode). A model held here only as
slices, or only by the swarm, is embedded by a peer that holds it whole (remote embeddings:
pipeline/embed_remote.py); with no such peer it is refused with a 409. The work goes through the
model's lock, like a completion (its wait is the trace's queue_ms), and runs on the model's executor;
a peer's EMBED runs the same way (`embed_held`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    truncate: str = "NONE"  # NIM's: NONE (too long is a 400) | END (keep the first tokens) | START (the last)


@dataclass
class EmbeddingResult:
    """One vector per input, in input order, and the tokens they took."""

    model: str
    vectors: np.ndarray  # float32 (inputs x width): made JSON off the loop
    prompt_tokens: int


def _param(request: EmbeddingRequest, i: int) -> str:
    return "input" if len(request.inputs) == 1 else f"input[{i}]"


async def run_embeddings(models: ModelManager, request: EmbeddingRequest, trace: RequestTrace,
                         node_short_id: str, remote: Any | None = None) -> EmbeddingResult:
    """Embed every input with the model's embedding context, here or (a model not held whole here)
    on a peer holding it whole through `remote` (a RemoteEmbedder); client errors are raised before
    any work."""
    served = await models.async_get(request.model)
    trace.model, trace.resolved = served.id, True
    if not served.whole and (remote is None or not remote.has_holder(served.entry.sha256)):
        where = "as slices only" if served.state == "slices" else "only by peers in the swarm"
        raise Conflict(f"model {served.id} is held on this node {where}, and no peer holding it whole serves "
                       "embeddings now; embeddings need the model whole on this node or on a peer", param="model")
    tok = served.tokenizer
    if tok is None:
        raise ModelUnavailable(f"model {served.id} cannot be served: {served.error}")
    texts = [(i, text) for i, text in enumerate(request.inputs) if isinstance(text, str)]

    limit = embed_limit(served.n_ctx)
    longest = limit if request.truncate == "NONE" else None  # cut after: all checked (the body bounds them)

    def prepare() -> list[list[int]]:  # the ids' check tokenizes too: off the loop
        for i, ids in enumerate(request.inputs):
            if not isinstance(ids, str):
                check_client_ids(tok, ids, _param(request, i), longest)
        return [tok.tokenize(text) for _, text in texts]

    tokenized = await asyncio.get_running_loop().run_in_executor(None, prepare)
    token_lists: list[list[int]] = [t if not isinstance(t, str) else [] for t in request.inputs]
    for (i, _), tokens in zip(texts, tokenized, strict=True):
        token_lists[i] = tokens
    if request.truncate != "NONE":
        token_lists = [t[:limit] if request.truncate == "END" else t[-limit:] for t in token_lists]
    check_tokens(token_lists, served.n_ctx, tok.n_vocab, lambda i: _param(request, i))
    total = sum(len(tokens) for tokens in token_lists)
    trace.prompt_tokens = total
    if not served.whole:
        vectors = await remote.async_embed(served, token_lists, request.dimensions, trace)
        return EmbeddingResult(served.id, vectors, total)

    def locked() -> None:
        trace.mark_dequeued()
        started = trace.begin_assembly()
        trace.route = "local"
        trace.end_assembly(started, [SegmentTrace(node_short_id, 0, served.entry.n_layers, "local")])

    models.admit(served)
    models.mark(served, waiting=+1)
    vectors = await embed_held(models, served, token_lists, request.dimensions, trace.request_id, locked)
    return EmbeddingResult(served.id, vectors, total)


def check_client_ids(tok: Any, ids: list[int], param: str, max_tokens: int | None = None) -> None:
    """Token ids a client sent are this model's: in its vocabulary, and its own tokenization of the
    text they spell (a BOS before and an EOS after aside). Ids made by another tokenizer would be
    embedded as a different text with no error: LangChain's OpenAIEmbeddings sends OpenAI's tiktoken
    (cl100k) ids by default. A 400 naming the setting instead (short ids may still pass: a few
    foreign tokens can spell a text this model tokenizes the same way)."""
    hint = (f"`{param}` holds token ids that are not this model's: ids from another tokenizer are "
            "another text to this model. LangChain's OpenAIEmbeddings sends OpenAI's tiktoken ids "
            "unless made with `check_embedding_ctx_length=False`; send the text instead, or ids "
            "from this node's POST /tokenize")
    bad = next((t for t in ids if not 0 <= t < tok.n_vocab), None)
    if bad is not None:
        raise InvalidRequest(f"{hint} (token id {bad} is outside the model's vocabulary, "
                             f"0..{tok.n_vocab - 1})", param="input")
    if max_tokens is not None and len(ids) > max_tokens:
        return  # too long: check_tokens says so
    core = ids[1:] if ids and ids[0] == tok.bos_id else ids
    core = core[:-1] if core and core[-1] == tok.eos_id else core
    if not core:
        return
    try:
        # a control token (`<|im_start|>`, written in the text) as its text: piece() renders none
        text = b"".join(tok.piece(t) or tok.special_piece(t).encode() for t in core).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"{hint} (they do not spell UTF-8 text)", param="input") from None
    back = tok.tokenize(text, add_bos=False)
    if back == core or (back[1:] == core and tok.piece(back[0]) == b" "):
        return  # (or less the lone space a SentencePiece vocabulary puts first)
    if text.startswith(" ") and tok.tokenize(text[1:], add_bos=False) == core:
        return  # a SentencePiece vocabulary's first piece carries the space it adds itself
    shown = text if len(text) <= 40 else text[:40] + "…"
    raise InvalidRequest(f"{hint} (they spell {shown!r} here, which this model tokenizes otherwise)",
                         param="input")


def check_tokens(token_lists: list[list[int]] | tuple[tuple[int, ...], ...], n_ctx: int, n_vocab: int,
                 param: Callable[[int], str]) -> None:
    """Each input has tokens, fits the embedding limit and the vocabulary (400s naming the input)."""
    limit = embed_limit(n_ctx)
    for i, tokens in enumerate(token_lists):
        if not tokens:
            raise InvalidRequest(f"`{param(i)}` gives no tokens: nothing to embed", param="input")
        if len(tokens) > limit:
            what = "context length" if limit == n_ctx else "input length for embeddings"
            raise ContextLengthExceeded(
                f"This model's maximum {what} is {limit} tokens. However, `{param(i)}` "
                f"is {len(tokens)} tokens. Please reduce the input.", param="input")
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"`{param(i)}` holds token id {bad}, outside the model's vocabulary "
                                 f"(0..{n_vocab - 1})", param="input")


def check_ids(ids: np.ndarray, lens: Sequence[int], n_ctx: int, n_vocab: int, param: Callable[[int], str]) -> None:
    """check_tokens for inputs given as one array of ids and each input's length (a peer's EMBED),
    vectorised: no Python object per id on the loop (each length is >= 1, each id >= 0: checked
    on decoding)."""
    limit = embed_limit(n_ctx)
    long = next((i for i, n in enumerate(lens) if n > limit), None)
    if long is not None:
        what = "context length" if limit == n_ctx else "input length for embeddings"
        raise ContextLengthExceeded(
            f"This model's maximum {what} is {limit} tokens. However, `{param(long)}` "
            f"is {lens[long]} tokens. Please reduce the input.", param="input")
    outside = np.flatnonzero(ids >= n_vocab)
    if outside.size:
        at = int(outside[0])
        i = int(np.searchsorted(np.cumsum(lens), at, side="right"))
        raise InvalidRequest(f"`{param(i)}` holds token id {int(ids[at])}, outside the model's vocabulary "
                             f"(0..{n_vocab - 1})", param="input")


async def embed_held(models: ModelManager, served: ServedModel, token_lists: Sequence[Sequence[int]],
                     dimensions: int | None, request_id: str, locked: Callable[[], None] = lambda: None,
                     cancel: asyncio.Event | None = None) -> np.ndarray:
    """The vectors of a model held whole here: the caller admitted the request and counted it in
    the model's `waiting` (models.mark(waiting=+1)); this waits for the model's lock (then calls
    `locked`), loads it on demand and embeds in runs (stopping between two when `cancel` is set).
    The vectors come back as one float32 array (inputs x n_embd), made on executors: millions of
    Python floats are never made, nor freed, on the loop."""
    queued, holding = True, False
    try:
        await served.lock.acquire()
        holding, queued = True, False
        models.mark(served, waiting=-1, busy=True)
        locked()
        await models.async_load_on_demand(served, request_id=request_id)
        await models.async_check_file(served)
        engine = served.engine
        if engine is None:
            raise ModelUnavailable(f"model {served.id} was unloaded while the request was starting")
        n_embd = await engine.async_run(engine.n_embd)
        if dimensions is not None and dimensions != n_embd:
            raise InvalidRequest(f"`dimensions` {dimensions} is not supported: model {served.id} gives "
                                 f"vectors of {n_embd} dimensions only", param="dimensions")
        parts: list[np.ndarray] = []
        for run in _runs(token_lists, EMBED_RUN_TOKENS):
            if cancel is not None and cancel.is_set():
                raise asyncio.CancelledError
            parts.append(await engine.async_run(_embed_run, engine, run))
        return await asyncio.get_running_loop().run_in_executor(None, np.concatenate, parts)
    finally:
        if queued:
            models.mark(served, waiting=-1)
        if holding:
            served.lock.release()
            models.mark(served, busy=False)


def _embed_run(engine: Any, run: list[Sequence[int]]) -> np.ndarray:
    """One run on the engine's executor: ids given as arrays (a peer's EMBED) become lists here,
    and the vectors one float32 array (run x n_embd)."""
    vectors = engine.embed([ids.tolist() if isinstance(ids, np.ndarray) else ids for ids in run])
    return np.asarray(vectors, dtype="<f4").reshape(len(vectors), -1)


def _runs(token_lists: Sequence[Sequence[int]], tokens: int) -> list[list[Sequence[int]]]:
    """The inputs in order, in runs of at most `tokens` tokens (an input longer than that alone)."""
    runs: list[list[Sequence[int]]] = []
    size = 0
    for item in token_lists:
        if not runs or size + len(item) > tokens:
            runs.append([])
            size = 0
        runs[-1].append(item)
        size += len(item)
    return runs
