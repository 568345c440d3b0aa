"""One /v1/embeddings request: resolve the model, tokenize, check, wait for the model, embed.

A model held whole here runs on this node's llama.cpp (embedding mode). A model held here only as
slices, or only by the swarm, is embedded by a peer that holds it whole (remote embeddings:
pipeline/embed_remote.py); with no such peer it is refused with a 409. The work goes through the
model's lock, like a completion (its wait is the trace's queue_ms), and runs on the model's executor;
a peer's EMBED runs the same way (`embed_held`).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from node import const
from node.errors import Conflict, ContextLengthExceeded, InvalidRequest, ModelUnavailable
from node.inference.embedder import embed_limit
from node.inference.manager import ModelManager
from node.inference.served import ServedModel
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
    if served.tokenizer is not None and served.tokenizer.reranker:  # its GGUF says so: no load for a 400
        raise InvalidRequest(f"model {served.id} is a reranker (rank pooling); it gives no embeddings: "
                             "use /v1/rerank", param="model")
    if not served.whole and (remote is None or not remote.has_holder(served.entry.sha256)):
        where = "as slices only" if served.state == "slices" else "only by peers in the swarm"
        raise Conflict(f"model {served.id} is held on this node {where}, and no peer holding it whole serves "
                       "embeddings now; embeddings need the model whole on this node or on a peer", param="model")
    tok = served.tokenizer
    if served.whole or tok is None:  # a failed load's reason before anything queues (a 500, not retried)
        await models.async_refuse_failed(served)
    assert tok is not None  # (refused above)
    limit = embed_limit(served.n_ctx)
    longest = limit if request.truncate == "NONE" else None  # cut after: all checked (the body bounds them)

    def prepare() -> list[list[int]]:  # tokenizing, checking and cutting: off the loop
        for i, ids in enumerate(request.inputs):
            if not isinstance(ids, str):
                check_client_ids(tok, ids, _param(request, i), longest)
        head, tail = special_ends(tok)
        lists = [tok.tokenize(t) if isinstance(t, str) else list(t) for t in request.inputs]
        if request.truncate != "NONE":
            lists = [cut(ids, limit, request.truncate, *((head, tail) if isinstance(t, str) else
                                                         client_ends(tok, ids)))
                     for t, ids in zip(request.inputs, lists, strict=True)]
        check_tokens(lists, served.n_ctx, tok.n_vocab, lambda i: _param(request, i))
        return lists

    token_lists = await asyncio.get_running_loop().run_in_executor(None, prepare)
    total = sum(len(tokens) for tokens in token_lists)
    trace.prompt_tokens = total
    if not served.whole:
        vectors = await remote.async_embed(served, token_lists, request.dimensions, trace,
                                           truncated=request.truncate != "NONE")
        return EmbeddingResult(served.id, vectors, total)

    models.admit(served)
    models.mark(served, waiting=+1)
    vectors = await embed_held(models, served, token_lists, request.dimensions, trace.request_id,
                               traced_local(trace, node_short_id, served))
    return EmbeddingResult(served.id, vectors, total)


def special_ends(tok: Any) -> tuple[int, int]:
    """How many ids `tok.tokenize` puts before a text's own (BOS, BERT's [CLS]) and after them
    (EOS, BERT's [SEP]): as the vocabulary adds them, found once by tokenizing with and without."""
    ends = getattr(tok, "_embed_special_ends", None)
    if ends is None:
        full, bare = tok.tokenize("a"), tok.tokenize("a", add_bos=False)
        head = next((k for k in range(len(full) - len(bare) + 1) if full[k:k + len(bare)] == bare), 0)
        ends = (head, max(0, len(full) - head - len(bare)))
        tok._embed_special_ends = ends
    return ends


def client_ends(tok: Any, ids: Sequence[int]) -> tuple[int, int]:
    """The specials a client's ids start and end with (a BOS, an EOS or the ids the vocabulary adds
    there, e.g. [CLS] / [SEP]), as special_ends counts a text's."""
    if not ids:
        return 0, 0
    head, tail = special_ends(tok)
    full = tok.tokenize("a") if head or tail else []
    starts = {tok.bos_id, *full[:head]} - {-1}
    ends = {tok.eos_id, *full[len(full) - tail:]} - {-1}
    first = int(ids[0] in starts)
    return first, int(len(ids) > first and ids[-1] in ends)


def cut(ids: list[int], limit: int, mode: str, head: int, tail: int) -> list[int]:
    """`truncate`: END keeps the first tokens, START the last, to `limit` in all; the `head` ids
    before and `tail` ids after the content (BOS / [CLS], EOS / [SEP]) stay, as the pooling reads
    them (CLS pooling reads the first, last-token pooling the last)."""
    if len(ids) <= limit:
        return ids
    keep = max(0, limit - head - tail)
    content = ids[head:len(ids) - tail]
    content = content[:keep] if mode == "END" else content[len(content) - keep:]
    return ids[:head] + content + ids[len(ids) - tail:]


def check_client_ids(tok: Any, ids: list[int], param: str, max_tokens: int | None = None) -> None:
    """Token ids a client sent are this model's: in its vocabulary, and its own tokenization of the
    text they spell (a BOS before and an EOS after aside). Ids made by another tokenizer would be
    embedded as a different text with no error: LangChain's OpenAIEmbeddings sends OpenAI's tiktoken
    (cl100k) ids by default. A 400 naming the setting instead (short ids may still pass: a few
    foreign tokens can spell a text this model tokenizes the same way). Only the first
    EMBED_CHECK_IDS ids are read (their cut end may tokenize otherwise); ids split at the unknown
    token (a character a UGM vocabulary lacks: `<unk>` is no text), and a window of ids may start
    or end inside a character."""
    hint = (f"`{param}` holds token ids that are not this model's: ids from another tokenizer are "
            "another text to this model. LangChain's OpenAIEmbeddings sends OpenAI's tiktoken ids "
            "unless made with `check_embedding_ctx_length=False`; send the text instead, or ids "
            "from this node's POST /tokenize")
    if ids and (min(ids) < 0 or max(ids) >= tok.n_vocab):
        bad = next(t for t in ids if not 0 <= t < tok.n_vocab)
        raise InvalidRequest(f"{hint} (token id {bad} is outside the model's vocabulary, "
                             f"0..{tok.n_vocab - 1})", param="input")
    if max_tokens is not None and len(ids) > max_tokens:
        return  # too long: check_tokens says so
    core = ids[1:] if ids and ids[0] == tok.bos_id else ids
    core = core[:-1] if core and core[-1] == tok.eos_id else core
    cut_end = len(core) > const.EMBED_CHECK_IDS
    core = core[:const.EMBED_CHECK_IDS]
    unk = getattr(tok, "unk_id", -1)
    if unk < 0 or unk not in core:
        return _round_trip(tok, core, hint, cut_end)
    stand_in = _unknown_char(tok)
    if stand_in:  # `<unk>` as its written name (BERT's [UNK] parses back), else as a character it stands for
        try:
            return _round_trip(tok, core, hint, cut_end)
        except InvalidRequest:
            return _round_trip(tok, core, hint, cut_end, stand_in)
    segments: list[list[int]] = [[]]
    for t in core:
        if t == unk:
            segments.append([])
        else:
            segments[-1].append(t)
    for n, segment in enumerate(segments):
        _round_trip(tok, segment, hint, cut_end and n == len(segments) - 1, beside_unk=True)


# characters few vocabularies hold: one a vocabulary tokenizes as its unknown token stands for it
_RARE = ("\U0001F99C", "\u4537", "\u8e36", "\U000179C0", "\U0002C8E9", "\ua4d0", "\u0f3a")


def _unknown_char(tok: Any) -> bytes:
    """A character the vocabulary tokenizes as its unknown token alone (b"" if none): `<unk>`
    renders as no text, so a client's ids holding it are checked with this character there
    (a run of unknown characters is one `<unk>`)."""
    found = getattr(tok, "_embed_unknown_char", None)
    if found is None:
        unk = getattr(tok, "unk_id", -1)
        found = b""
        for c in _RARE if unk >= 0 else ():
            if [t for t in tok.tokenize(c, add_bos=False) if not tok.piece(t).isspace()] == [unk]:
                found = c.encode()
                break
        tok._embed_unknown_char = found
    return found


# ids at the cut end of a checked prefix that may tokenize otherwise (a word cut in two)
_CUT_SLACK = 4


def _round_trip(tok: Any, core: list[int], hint: str, cut_end: bool, unk_as: bytes = b"",
                beside_unk: bool = False) -> None:
    """The text `core` spells tokenizes back to `core` (InvalidRequest if not); beside an unknown
    token, a lone space (the one before the unknown character) is taken as it is."""
    unk = getattr(tok, "unk_id", -1)
    pieces = [tok.piece(t) or (unk_as if t == unk and unk_as else tok.special_piece(t).encode()) for t in core]
    # a window of the model's ids may start or end inside a character (byte-fallback pieces):
    # those edge ids are left out; invalid bytes anywhere else are refused
    lead = 0
    while lead < 3 and lead < len(pieces) and pieces[lead] and all(0x80 <= c < 0xC0 for c in pieces[lead]):
        lead += 1
    data = b"".join(pieces[lead:])
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        raise InvalidRequest(f"{hint} (they do not spell UTF-8 text)", param="input") from None
    pending, end = len(decoder.getstate()[0]), len(pieces)
    while pending > 0 and end > lead:
        end -= 1
        pending -= len(pieces[end])
    core = core[lead:end]
    if not core:
        return
    if beside_unk:  # the spaces around an unknown character are pieces of their own there
        while end > lead and pieces[end - 1].isspace():
            end -= 1
        while lead < end and pieces[lead].isspace():
            lead += 1
        core = core[lead:end]
        if not core:
            return
    text = b"".join(pieces[lead:end]).decode("utf-8")
    back = tok.tokenize(text, add_bos=False)

    def same(a: list[int], b: list[int]) -> bool:
        if not cut_end:
            return a == b
        n = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return n >= len(b) - _CUT_SLACK

    if same(back, core) or (back and same(back[1:], core) and tok.piece(back[0]) == b" "):
        return  # (or less the lone space a SentencePiece vocabulary puts first)
    if text.startswith(" ") and same(tok.tokenize(text[1:], add_bos=False), core):
        return  # a SentencePiece vocabulary's first piece carries the space it adds itself
    shown = text if len(text) <= 40 else text[:40] + "…"
    raise InvalidRequest(f"{hint} (they spell {shown!r} here, which this model tokenizes otherwise)",
                         param="input")


def check_tokens(token_lists: list[list[int]] | tuple[tuple[int, ...], ...], n_ctx: int, n_vocab: int,
                 param: Callable[[int], str]) -> None:
    """Each input has tokens, fits the embedding limit and the vocabulary (400s naming the input);
    min/max walk the ids in C (runs on an executor)."""
    limit = embed_limit(n_ctx)
    for i, tokens in enumerate(token_lists):
        if not tokens:
            raise InvalidRequest(f"`{param(i)}` gives no tokens: nothing to embed", param="input")
        if len(tokens) > limit:
            what = "context length" if limit == n_ctx else "input length for embeddings"
            raise ContextLengthExceeded(
                f"This model's maximum {what} is {limit} tokens. However, `{param(i)}` "
                f"is {len(tokens)} tokens. Please reduce the input.", param="input")
        if min(tokens) < 0 or max(tokens) >= n_vocab:
            bad = next(t for t in tokens if not 0 <= t < n_vocab)
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


def traced_local(trace: RequestTrace, node_short_id: str, served: ServedModel) -> Callable[[], None]:
    """What held_engine calls once the model's lock is taken: the request leaves the queue and its
    route is this node's whole model, one local segment."""
    def locked() -> None:
        trace.mark_dequeued()
        started = trace.begin_assembly()
        trace.route = "local"
        trace.end_assembly(started, [SegmentTrace(node_short_id, 0, served.entry.n_layers, "local")])
    return locked


@contextlib.asynccontextmanager
async def held_engine(models: ModelManager, served: ServedModel, request_id: str,
                      locked: Callable[[], None] = lambda: None) -> AsyncIterator[Any]:
    """The engine of a model held whole here, for embeddings and reranking alike: the caller admitted
    the request and counted it in the model's `waiting` (models.mark(waiting=+1)); this waits for
    the model's lock (then calls `locked`), loads the model on demand, and frees the lock and the
    counts when the block ends (a completion on the model waits between two of its runs only)."""
    queued, holding = True, False
    try:
        await models.async_refuse_failed(served)  # (a peer's EMBED: its check could not stat the file)
        await served.lock.acquire()
        holding, queued = True, False
        models.mark(served, waiting=-1, busy=True)
        locked()
        await models.async_load_on_demand(served, request_id=request_id)
        await models.async_check_file(served)
        engine = served.engine
        if engine is None:
            raise ModelUnavailable(f"model {served.id} was unloaded while the request was starting")
        yield engine
    finally:
        if queued:
            models.mark(served, waiting=-1)
        if holding:
            served.lock.release()
            models.mark(served, busy=False)


async def embed_held(models: ModelManager, served: ServedModel, token_lists: Sequence[Sequence[int]],
                     dimensions: int | None, request_id: str, locked: Callable[[], None] = lambda: None,
                     cancel: asyncio.Event | None = None) -> np.ndarray:
    """The vectors of a model held whole here (held_engine: the caller admitted the request and
    counted it in `waiting`), embedded in runs (stopping between two when `cancel` is set). The
    vectors come back as one float32 array (inputs x n_embd), made on executors: millions of
    Python floats are never made, nor freed, on the loop."""
    async with held_engine(models, served, request_id, locked) as engine:
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
