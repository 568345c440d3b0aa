"""Whole-model execution through llama-cpp-python, on a dedicated single-thread executor.

Every call into llama.cpp (load, tokenize for long prompts, generate, free) runs on the model's
own thread, so the event loop never blocks and one llama context is never used concurrently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import time
from pathlib import Path

import numpy as np

from node.errors import EngineError, InvalidRequest, ModelLoadError, NodeError
from node.inference import constrain, llamacpp
from node.inference.handoff import GenerationJob, TokenChannel
from node.inference.logprobs import scores_from_logits
from node.logs import kv

log = logging.getLogger(__name__)


def physical_cores() -> int:
    """Threads for compute: physical cores (hyper-threads slow matmuls down)."""
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except Exception:  # psutil missing: fall back to logical cores
        return os.cpu_count() or 1


class LlamaEngine:
    """One loaded GGUF model in llama.cpp; blocking methods run on `self.executor`."""

    def __init__(self, model_id: str, path: Path, *, n_ctx: int, n_threads: int, n_gpu_layers: int = 0):
        self.model_id = model_id
        self.path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or physical_cores()
        self.n_gpu_layers = n_gpu_layers
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llama-{model_id[:16]}")
        self.llm = None
        self.embedder = None  # a second context with embeddings on, loaded on the first embeddings request
        self.ms_per_token: float | None = None  # EWMA of recent decode steps (advertised to peers)

    # --- lifecycle (blocking; run on the executor) ---

    def load(self) -> None:
        """Load the model (blocking)."""
        llama_cpp = llamacpp.load()
        started = time.monotonic()
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(self.path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                n_gpu_layers=self.n_gpu_layers,
                n_batch=min(512, self.n_ctx),
                verbose=False,
            )
        except Exception as exc:  # llama.cpp raises ValueError/RuntimeError with little detail
            raise ModelLoadError(f"llama.cpp could not load {self.path.name}: {exc}") from exc
        log.info("DIAG: load_model %s", kv(model=self.model_id, backend_type="llama.cpp",
                                           n_ctx=self.n_ctx, n_threads=self.n_threads,
                                           n_gpu_layers=self.n_gpu_layers,
                                           elapsed_ms=int((time.monotonic() - started) * 1000)))

    def close(self) -> None:
        """Free llama.cpp memory, the embedding context's too (blocking)."""
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self.llm is not None:
            self.llm.close()
            self.llm = None
        self.ms_per_token: float | None = None  # EWMA of recent decode steps (advertised to peers)

    # --- generation (blocking; runs on the executor) ---

    def generate(self, job: GenerationJob, channel: TokenChannel, is_eog, vocab=None) -> None:
        """Sample tokens into the channel until EOG, max tokens, context end or cancel.

        `vocab` (the model's ModelTokenizer) is needed when the job has a grammar or a logit_bias:
        they become a logits processor, the first step of llama.cpp's sampler chain (before the
        penalties, top-k/p, temperature), and the grammar's matcher follows each sampled token."""
        llm = self.llm
        if llm is None:
            channel.close(EngineError(f"model {self.model_id} is not loaded"))
            return
        p = job.params
        try:
            constraint = None
            if p.grammar is not None or p.logit_bias:
                if vocab is None:
                    raise EngineError("a constrained generation needs the model's vocabulary")
                constraint = constrain.constraint_for(vocab, p, job.history)
        except NodeError as exc:
            channel.close(exc)
            return
        try:
            llm.set_seed(p.seed if p.seed is not None else random.getrandbits(32))
            produced = 0
            generator = llm.generate(
                job.prompt_tokens,
                top_k=p.top_k,
                top_p=p.top_p,
                min_p=p.min_p,
                temp=p.temperature,
                repeat_penalty=p.repeat_penalty,
                frequency_penalty=p.frequency_penalty,
                presence_penalty=p.presence_penalty,
                reset=True,
                logits_processor=None if constraint is None else [lambda _ids, logits: constraint.apply(logits)],
            )
            scores = self._scorer(llm, p.logprobs)
            last = None
            try:
                for token in generator:
                    now = time.monotonic()
                    if last is not None:  # decode steps only: the first token's time is the prefill's
                        step_ms = (now - last) * 1000
                        ewma = self.ms_per_token
                        self.ms_per_token = step_ms if ewma is None else 0.9 * ewma + 0.1 * step_ms
                    last = now
                    if job.cancel.is_set():
                        break
                    channel.put(token, None if scores is None else scores(token))
                    produced += 1
                    if is_eog(token) or produced >= job.max_new_tokens or job.cancel.is_set():
                        break
                    if constraint is not None:
                        constraint.accept(token)
            finally:
                generator.close()
        except NodeError as exc:
            channel.close(exc)
            return
        except Exception as exc:  # llama.cpp decode failure: report it on the stream
            log.error("DIAG: local stream generate_stream error — executor error model=%s error=%s",
                      self.model_id, exc)
            channel.close(EngineError(f"llama.cpp generation failed: {exc}"))
            return
        channel.close()

    @staticmethod
    def _scorer(llm, n_top: int | None):
        """None when logprobs are off; else token -> TokenScores from the logits llama.cpp sampled it
        from: the context's last output row, still there while `generate` is suspended at its yield
        (it evaluates the token after we resume it). Raw logits: the model's distribution, before
        penalties, bias, grammar and temperature (see node.inference.logprobs)."""
        if n_top is None:
            return None
        llama_cpp = llamacpp.load()
        n_vocab = llm.n_vocab()

        def scores(token: int):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
            return scores_from_logits(row, token, n_top)
        return scores

    # --- embeddings (blocking; run on the executor) ---

    def n_embd(self) -> int:
        """The model's embedding size."""
        if self.llm is None:
            raise EngineError(f"model {self.model_id} is not loaded")
        return self.llm.n_embd()

    def embedding_pooling(self) -> int:
        """The pooling the model declares (GGUF `<arch>.pooling_type`), or mean when it declares none."""
        llama_cpp = llamacpp.load()
        meta = self.llm.metadata if self.llm is not None else {}
        declared = meta.get(f"{meta.get('general.architecture', '')}.pooling_type")
        try:
            pooling = int(declared) if declared is not None else llama_cpp.LLAMA_POOLING_TYPE_NONE
        except ValueError:
            pooling = llama_cpp.LLAMA_POOLING_TYPE_NONE
        if pooling <= llama_cpp.LLAMA_POOLING_TYPE_NONE:  # a generative model: one vector per input, the mean
            return llama_cpp.LLAMA_POOLING_TYPE_MEAN
        if pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK:
            raise InvalidRequest(f"model {self.model_id} is a reranker (rank pooling); it gives no embeddings",
                                 param="model")
        return pooling

    def _embedding_context(self):
        if self.embedder is not None:
            return self.embedder
        llama_cpp = llamacpp.load()
        pooling = self.embedding_pooling()
        started = time.monotonic()
        try:
            # the whole input in one batch and one micro-batch: pooled embeddings need that
            self.embedder = llama_cpp.Llama(
                model_path=str(self.path), embedding=True, pooling_type=pooling,
                n_ctx=self.n_ctx, n_batch=self.n_ctx, n_ubatch=self.n_ctx,
                n_threads=self.n_threads, n_threads_batch=self.n_threads,
                n_gpu_layers=self.n_gpu_layers, verbose=False)
        except Exception as exc:
            raise ModelLoadError(f"llama.cpp could not load {self.path.name} for embeddings: {exc}") from exc
        log.info("DIAG: load_embedding_context %s", kv(model=self.model_id, pooling=pooling, n_ctx=self.n_ctx,
                                                       elapsed_ms=int((time.monotonic() - started) * 1000)))
        return self.embedder

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled vector per token list, each decoded alone (blocking; every list fits n_ctx).

        Uses llama-cpp-python's batch and context the way its own `Llama.embed` does, since that
        method takes only strings."""
        llama_cpp = llamacpp.load()
        llm = self._embedding_context()
        n_embd = llm.n_embd()
        vectors = []
        try:
            for tokens in inputs:
                llm._batch.reset()
                llm._batch.add_sequence(tokens, 0, True)
                llm._ctx.kv_cache_clear()
                llm._ctx.decode(llm._batch)
                pointer = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
                if not pointer:
                    raise EngineError("llama.cpp returned no pooled embedding")
                vectors.append(pointer[:n_embd])
        except EngineError:
            raise
        except Exception as exc:  # llama.cpp decode failure
            raise EngineError(f"llama.cpp embedding failed: {exc}") from exc
        finally:
            llm._batch.reset()
        return vectors

    # --- async wrappers ---

    async def async_run(self, fn, *args):
        """Run a blocking method of this engine on its executor."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def shutdown(self) -> None:
        """Stop the executor thread (after close())."""
        self.executor.shutdown(wait=False, cancel_futures=True)
