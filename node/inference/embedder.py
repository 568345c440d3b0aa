"""The embedding context of a loaded whole model: llama.cpp with embeddings on, pooled, one input
per decode (blocking; every method runs on the model's executor thread).

The context is made on the model `LlamaEngine` already holds (no second load of the weights: on a
GPU that was a second copy of them). A pooled embedding needs the whole input in ONE micro-batch,
and llama.cpp reserves the attention scratch for a full micro-batch over the whole context: without
flash attention that is n_ubatch x n_ctx x n_head floats, 3.4 GB for a 110M model at 8192 tokens,
137 GB for a 32-head model at 32768 (the context could not be made: every embeddings request
failed with a 500 until 2026-12-06). So the context is sized to the longest input seen (a power of
two, at least EMBED_MIN_CONTEXT_TOKENS), made again larger when a longer one comes, at most
EMBED_MAX_INPUT_TOKENS (OpenAI's limit per input), with llama.cpp's flash attention where the
backend has it (auto).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from node.const import EMBED_MAX_INPUT_TOKENS, EMBED_MIN_CONTEXT_TOKENS
from node.errors import EngineError, ModelLoadError
from node.logs import kv

log = logging.getLogger(__name__)


def embed_limit(n_ctx: int) -> int:
    """The most tokens one input may have on a model served at `n_ctx`."""
    return min(n_ctx, EMBED_MAX_INPUT_TOKENS)


def context_size(n_tokens: int, n_ctx: int) -> int:
    """The embedding context for an input of `n_tokens`: the next power of two, bounded."""
    size = EMBED_MIN_CONTEXT_TOKENS
    while size < n_tokens:
        size *= 2
    return min(size, embed_limit(n_ctx))


class Embedder:
    """One llama.cpp context with embeddings on, over `model` (a llama_model pointer)."""

    def __init__(self, ll, model, *, model_id: str, pooling: int, n_ctx: int, n_threads: int):
        self.ll = ll
        self.model = model
        self.model_id = model_id
        self.pooling = pooling
        self.n_ctx = n_ctx  # the model's served context; inputs are at most embed_limit(n_ctx)
        self.n_threads = n_threads
        self.n_embd = ll.llama_model_n_embd(model)
        self.ctx = None
        self.batch = None
        self.size = 0  # tokens the current context takes in one input

    def _fit(self, n_tokens: int) -> None:
        if self.ctx is not None and n_tokens <= self.size:
            return
        if n_tokens > embed_limit(self.n_ctx):
            raise EngineError(f"an input of {n_tokens} tokens is over the embeddings limit")
        ll = self.ll
        size = context_size(n_tokens, self.n_ctx)
        started = time.monotonic()
        params = ll.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = size  # the whole input in one micro-batch
        params.n_seq_max = 1
        params.embeddings = True
        params.pooling_type = self.pooling
        params.n_threads = params.n_threads_batch = self.n_threads
        params.no_perf = True
        params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_AUTO
        ctx = ll.llama_init_from_model(self.model, params)
        if not ctx:  # the smaller context stays for the inputs it fits
            raise ModelLoadError(f"llama.cpp could not make an embedding context of {size} tokens for "
                                 f"{self.model_id}")
        self.close()
        self.ctx, self.batch, self.size = ctx, ll.llama_batch_init(size, 0, 1), size
        log.info("DIAG: embedding context %s", kv(model=self.model_id, pooling=self.pooling, tokens=size,
                                                  elapsed_ms=int((time.monotonic() - started) * 1000)))

    def _decode(self, tokens: list[int]):
        """Decode one input alone; the pointer to its pooled output (n_embd floats, or a reranker's
        n_cls_out scores)."""
        ll, batch = self.ll, self.batch
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(tokens)
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        status = ll.llama_decode(self.ctx, batch)
        if status != 0:
            raise EngineError(f"llama.cpp embedding failed: llama_decode returned {status}")
        pointer = ll.llama_get_embeddings_seq(self.ctx, 0)
        if not pointer:
            raise EngineError("llama.cpp returned no pooled embedding")
        return pointer

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled vector per token list, each decoded alone, of unit length (L2)."""
        self._fit(max(len(tokens) for tokens in inputs))
        vectors = []
        for tokens in inputs:
            pointer = self._decode(tokens)
            vector = np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).astype(np.float64)
            norm = float(np.linalg.norm(vector))
            # float32 values, as llama.cpp's: the float and base64 forms of a reply stay equal
            vectors.append((vector / norm if norm > 0 else vector).astype(np.float32).tolist())
        return vectors

    def rank(self, inputs: list[list[int]]) -> list[float]:
        """A reranker's score of each token list (a query/document pair), each decoded alone: the
        first of the classifier's outputs, as llama-server's /rerank reads it (rank pooling)."""
        self._fit(max(len(tokens) for tokens in inputs))
        return [float(self._decode(tokens)[0]) for tokens in inputs]

    def close(self) -> None:
        if self.ctx is not None:
            self.ll.llama_batch_free(self.batch)
            self.ll.llama_free(self.ctx)
            self.ctx = self.batch = None
            self.size = 0
