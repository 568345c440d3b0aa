"""Whole-model execution through llama-cpp-python, on a dedicated single-thread executor.

Every call into llama.cpp (load, the batch loop of node.inference.batch_engine, embeddings, free)
runs on the model's own thread, so the event loop never blocks and one llama context is never
used concurrently. Generations join the model's batch (`submit`); many decode at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from pathlib import Path

from node.errors import EngineError, InvalidRequest, ModelLoadError, NodeError
from node.inference import llamacpp
from node.inference.batch_engine import BatchEngine
from node.inference.embedder import Embedder
from node.inference.handoff import GenerationJob, TokenChannel
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

    def __init__(self, model_id: str, path: Path, *, n_ctx: int, n_threads: int, n_gpu_layers: int = 0,
                 max_concurrent: int = 1, kv_cache_seqs: int = 0, kv_spare: bool = True, speculative_max_draft: int = 0,
                 flash_attention: bool = False):
        self.model_id = model_id
        self.path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or physical_cores()
        self.n_gpu_layers = n_gpu_layers
        self.max_concurrent = max_concurrent
        self.kv_cache_seqs = kv_cache_seqs
        self.kv_spare = kv_spare
        self.speculative_max_draft = speculative_max_draft  # n-gram speculation; 0 = off
        self.flash_attention = flash_attention  # NodeConfig.flash_attention (see batch_engine)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llama-{model_id[:16]}")
        self.model = None  # llama-cpp-python's LlamaModel (weights, vocabulary, metadata)
        self.batcher: BatchEngine | None = None  # the generation context, its sequences and loop
        self.embedder: Embedder | None = None  # a context with embeddings on, made on the first embeddings request
        self._calls_waiting = 0  # async_run calls queued for the executor (the batch loop lets them in)
        self._file: tuple[int, int, int] | None = None  # (st_dev, st_ino, st_size) of the file loaded
        self.identity: tuple[int, int] | None = None  # (size, mtime_ns) as load() found the file
        self.file_change_said = False  # ModelManager.async_check_file logged it
        self._calls_lock = threading.Lock()

    @property
    def ms_per_token(self) -> float | None:
        """EWMA of recent decode steps (advertised to peers); None before any."""
        return None if self.batcher is None else self.batcher.ms_per_token

    # --- lifecycle (blocking; run on the executor) ---

    def load(self) -> None:
        """Load the model and its batch context (blocking)."""
        llama_cpp = llamacpp.load()
        from llama_cpp import _internals

        low = llama_cpp.llama_cpp
        started = time.monotonic()
        said: list[str] = []  # llama.cpp's warnings and errors while the weights load
        try:
            st = os.stat(self.path)
            self._file = (st.st_dev, st.st_ino, st.st_size)
            self.identity = (st.st_size, st.st_mtime_ns)  # the file this load reads (a failure names it)
            params = low.llama_model_default_params()
            params.n_gpu_layers = self.n_gpu_layers
            with llamacpp.capture_errors() as said:
                self.model = _internals.LlamaModel(path_model=str(self.path), params=params, verbose=False)
            self.batcher = BatchEngine(low, self.model.model, model_id=self.model_id, n_ctx=self.n_ctx,
                                       max_concurrent=self.max_concurrent, cache_seqs=self.kv_cache_seqs, spare=self.kv_spare,
                                       n_threads=self.n_threads, executor=self.executor,
                                       n_batch=max(min(512, self.n_ctx), self.max_concurrent),
                                       speculative_max_draft=self.speculative_max_draft,
                                       flash_attention=self.flash_attention,
                                       others_waiting=lambda: self._calls_waiting > 0)
        except Exception as exc:  # llama.cpp raises ValueError/RuntimeError with little detail
            if self.model is not None:
                self.model.close()
                self.model = None
            raise ModelLoadError(llamacpp.with_cause(f"llama.cpp could not load {self.path.name}: {exc}", said)) from exc
        b = self.batcher
        log.info("DIAG: load_model %s", kv(model=self.model_id, backend_type="llama.cpp",
                                           n_ctx=self.n_ctx, n_threads=self.n_threads,
                                           n_gpu_layers=self.n_gpu_layers, max_concurrent=b.max_concurrent,
                                           kv_sequences=b.n_slots, kv_tokens=b.n_slots * self.n_ctx,
                                           elapsed_ms=int((time.monotonic() - started) * 1000)))

    def close(self) -> None:
        """Free llama.cpp memory, the embedding context's too (blocking)."""
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None
        if self.model is not None:
            self.model.close()
            self.model = None

    def file_changed(self) -> str | None:
        """How the loaded file's size changed since the load, or None (blocking: a stat). llama.cpp
        maps the file: reading a page past a cut end kills the process with SIGBUS (a `cp` of a new
        download over the served file did). A file deleted, or replaced by a rename, leaves the
        mapping whole: None."""
        if self._file is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        dev, ino, size = self._file
        if (st.st_dev, st.st_ino) != (dev, ino) or st.st_size == size:
            return None
        return f"its size went from {size} to {st.st_size} bytes"

    # --- generation ---

    def submit(self, job: GenerationJob, channel: TokenChannel, is_eog, vocab=None) -> concurrent.futures.Future:
        """Join the batch (any thread, never blocks): tokens go to `channel` until EOG, max tokens,
        the context's end or cancel; the future is done when the sequence has ended. `vocab` (the
        model's ModelTokenizer) is needed when the job has a grammar or a logit_bias."""
        batcher = self.batcher
        if batcher is None:
            channel.close(EngineError(f"model {self.model_id} is not loaded"))
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(None)
            return done
        try:
            return batcher.submit(job, channel, is_eog, vocab)
        except EngineError as exc:  # unloaded in between
            channel.close(exc)
            done = concurrent.futures.Future()
            done.set_result(None)
            return done

    async def async_generate(self, job: GenerationJob, channel: TokenChannel, is_eog, vocab=None) -> None:
        """`submit`, awaited on the loop."""
        await asyncio.wrap_future(self.submit(job, channel, is_eog, vocab))

    def generate(self, job: GenerationJob, channel: TokenChannel, is_eog, vocab=None) -> None:
        """`submit`, waited for (blocking; never on the engine's own executor thread)."""
        self.submit(job, channel, is_eog, vocab).result()

    # --- embeddings (blocking; run on the executor) ---

    def n_embd(self) -> int:
        """The model's embedding size."""
        if self.model is None:
            raise EngineError(f"model {self.model_id} is not loaded")
        return self.model.n_embd()

    def embedding_pooling(self) -> int:
        """The pooling the model declares (GGUF `<arch>.pooling_type`), or mean when it declares none."""
        llama_cpp = llamacpp.load()
        meta = self.model.metadata() if self.model is not None else {}
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

    def _embedding_context(self, rank: bool = False) -> Embedder:
        if self.embedder is None:
            if self.model is None:
                raise EngineError(f"model {self.model_id} is not loaded")
            pooling = self.rank_pooling() if rank else self.embedding_pooling()
            self.embedder = Embedder(llamacpp.load().llama_cpp, self.model.model, model_id=self.model_id,
                                     pooling=pooling, n_ctx=self.n_ctx, n_threads=self.n_threads)
        elif (self.embedder.pooling == llamacpp.load().LLAMA_POOLING_TYPE_RANK) != rank:
            self.rank_pooling() if rank else self.embedding_pooling()  # the other kind's 400
        return self.embedder

    def rank_pooling(self) -> int:
        """Rank pooling, for a model that declares it (a reranker); else a 400 naming the model."""
        rank = llamacpp.load().LLAMA_POOLING_TYPE_RANK
        meta = self.model.metadata() if self.model is not None else {}
        if meta.get(f"{meta.get('general.architecture', '')}.pooling_type") != str(rank):
            raise InvalidRequest(f"model {self.model_id} is not a reranker (its GGUF declares no rank "
                                 "pooling); /v1/rerank needs a reranker model", param="model")
        return rank

    def rank(self, inputs: list[list[int]]) -> list[float]:
        """A reranker's score of each query/document pair's tokens, each decoded alone (blocking;
        every list within `embedder.embed_limit(n_ctx)`). See node.inference.rerank."""
        try:
            return self._embedding_context(rank=True).rank(inputs)
        except NodeError:  # not a reranker, a context llama.cpp could not make
            raise
        except Exception as exc:  # llama.cpp failure
            raise EngineError(f"llama.cpp reranking failed: {exc}") from exc

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled vector per token list, each decoded alone (blocking; every list within
        `embedder.embed_limit(n_ctx)`), of unit length (L2), as OpenAI's embeddings and
        llama-server's (`--embd-normalize 2`, its default) are: an app that ranks by dot product
        (an inner-product index) gets cosine order. See node.inference.embedder."""
        try:
            return self._embedding_context().embed(inputs)
        except NodeError:  # a reranker's 400, a context llama.cpp could not make
            raise
        except Exception as exc:  # llama.cpp failure
            raise EngineError(f"llama.cpp embedding failed: {exc}") from exc

    # --- async wrappers ---

    async def async_run(self, fn, *args):
        """Run a blocking method of this engine on its executor (between two steps of a running
        batch loop, which would otherwise keep the thread while requests keep coming)."""
        with self._calls_lock:
            self._calls_waiting += 1
        started = False

        def call():
            nonlocal started
            with self._calls_lock:
                if not started:
                    self._calls_waiting -= 1
                    started = True
            return fn(*args)

        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, call)
        finally:
            with self._calls_lock:
                if not started:  # never ran (cancelled in the queue, or the executor was shut down)
                    self._calls_waiting -= 1
                    started = True

    def shutdown(self) -> None:
        """Stop the executor thread (after close())."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def async_close(self) -> None:
        """close() on the executor, then stop its thread. Cancelled (an unload whose client left, a
        stop step cut short), the close still runs after what is on the thread: until 2026-12-07 the
        queued close was cancelled with it, and llama.cpp's context and weights were never freed."""
        try:
            await self.async_run(self.close)
        except BaseException:
            self.abandon()
            raise
        self.shutdown()

    def abandon(self) -> None:
        """Free this engine once what runs on its executor is done, then stop the thread: for a load
        given up on (cancelled, the node stopping), which goes on in its thread and cannot be stopped.
        Until 2026-12-07 such a load's engine kept its weights and an idle thread for good."""
        self.executor.submit(self.close)  # (after the load: one thread)
        self.executor.shutdown(wait=False)
