"""One rerank request (/v1/rerank): resolve the model, build each query/document pair, wait for the
model, score.

A reranker is a GGUF that declares rank pooling (`<arch>.pooling_type` = 4: bge-reranker, jina-reranker,
Qwen3-Reranker). Each pair is built as llama-server builds it (format_prompt_rerank): the GGUF's
rerank template (`tokenizer.chat_template.rerank`, `{query}` and `{document}` filled in, special
tokens parsed) if it has one, else [BOS] query [EOS] [SEP] document [EOS], each special only where
the vocabulary adds it (EOS falling back to SEP), query and document tokenized as plain text. Each
pair is decoded alone in the model's embedding context (rank pooling) and scored by the first
classifier output, as llama-server reads it; a pair longer than the embedding limit is a 400.

Reranking runs only on a node holding the model whole: the remote-embeddings path (EMBED frames)
carries vectors, not scores, so a model held here as slices or only by peers is a 409.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from node.errors import Conflict, ContextLengthExceeded, InvalidRequest
from node.inference.embedder import embed_limit
from node.inference.embeddings import EMBED_RUN_TOKENS, _runs, held_engine, traced_local
from node.inference.manager import ModelManager
from node.inference.served import ServedModel
from node.trace import RequestTrace

log = logging.getLogger(__name__)

_SLOTS = re.compile(r"\{query\}|\{document\}")


@dataclass
class RerankRequest:
    """A validated rerank request."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None = None  # None: every document
    return_documents: bool = False
    tei: bool = False  # the body gave `texts` (HF text-embeddings-inference's shape, as llama-server)


@dataclass
class RerankResult:
    """One score per document, in input order, and the tokens the pairs took."""

    model: str
    scores: list[float]
    prompt_tokens: int


def pair_tokens(tok: Any, query: str, document: str) -> list[int]:
    """The ids of one query/document pair, as llama-server builds them for a reranker."""
    if tok.rerank_template is not None:  # one pass: a query that holds "{document}" stays text
        prompt = _SLOTS.sub(lambda m: query if m.group(0) == "{query}" else document, tok.rerank_template)
        return tok.tokenize(prompt, add_bos=False, special=True)
    eos = tok.eos_id if tok.eos_id >= 0 else tok.sep_id
    ids = [tok.bos_id] if tok.add_bos and tok.bos_id >= 0 else []
    ids += tok.tokenize(query, add_bos=False, special=False)
    if tok.add_eos and eos >= 0:
        ids.append(eos)
    if tok.add_sep and tok.sep_id >= 0:
        ids.append(tok.sep_id)
    ids += tok.tokenize(document, add_bos=False, special=False)
    if tok.add_eos and eos >= 0:
        ids.append(eos)
    return ids


def check_pairs(pairs: list[list[int]], n_ctx: int) -> None:
    """Each pair has tokens and fits one decode of the embedding context (400s naming the document)."""
    limit = embed_limit(n_ctx)
    for i, ids in enumerate(pairs):
        if not ids:
            raise InvalidRequest(f"the query with `documents[{i}]` gives no tokens: nothing to score",
                                 param="documents")
        if len(ids) > limit:
            what = "context length" if limit == n_ctx else "input length for reranking"
            raise ContextLengthExceeded(
                f"This model's maximum {what} is {limit} tokens. However, the query with `documents[{i}]` "
                f"is {len(ids)} tokens. Please shorten the query or the document.", param="documents")


async def run_rerank(models: ModelManager, request: RerankRequest, trace: RequestTrace,
                     node_short_id: str) -> RerankResult:
    """Score every document against the query with a reranker held whole here; client errors are
    raised before any work."""
    served = await models.async_get(request.model)  # 404 unknown
    trace.model, trace.resolved = served.id, True
    tok = served.tokenizer
    if served.whole or tok is None:  # a failed load's reason before anything queues
        await models.async_refuse_failed(served)
    if tok is not None and not tok.reranker:
        raise InvalidRequest(f"model {served.id} is not a reranker (its GGUF declares no rank pooling); "
                             "/v1/rerank needs a reranker model such as bge-reranker or Qwen3-Reranker",
                             param="model")
    if not served.whole:
        where = "as slices only" if served.state == "slices" else "only by peers in the swarm"
        raise Conflict(f"model {served.id} is held on this node {where}; reranking runs only on a node "
                       "holding the reranker whole (peers do not rerank for others)", param="model")
    assert tok is not None  # (refused above)

    def prepare() -> list[list[int]]:  # tokenizing and checking: off the loop
        pairs = [pair_tokens(tok, request.query, doc) for doc in request.documents]
        check_pairs(pairs, served.n_ctx)
        return pairs

    pairs = await asyncio.get_running_loop().run_in_executor(None, prepare)
    total = sum(len(ids) for ids in pairs)
    trace.prompt_tokens = total

    models.admit(served)
    models.mark(served, waiting=+1)
    scores = await rank_held(models, served, pairs, trace.request_id, traced_local(trace, node_short_id, served))
    return RerankResult(served.id, scores, total)


async def rank_held(models: ModelManager, served: ServedModel, pairs: Sequence[list[int]], request_id: str,
                    locked: Callable[[], None]) -> list[float]:
    """The scores of a reranker held whole here (embeddings.held_engine: the caller admitted the
    request and counted it in `waiting`), scored in runs of about EMBED_RUN_TOKENS tokens."""
    async with held_engine(models, served, request_id, locked) as engine:
        scores: list[float] = []
        for run in _runs(pairs, EMBED_RUN_TOKENS):
            scores += await engine.async_run(engine.rank, run)
        return scores
