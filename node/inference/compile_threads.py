"""The threads grammars compile on: llguidance's compiler recurses once per level a grammar's rules (or
a JSON schema's $ref chain) nest, and on a thread's default 8 MiB stack ~3,000 levels overflowed it — a
segfault of the whole node from one request's 25 KB `grammar` or `response_format`, or one peer's WORK
frame (review r53). Two threads per process, started once with a COMPILE_STACK_BYTES stack; the grammar
text (grammar.MAX_GRAMMAR_CHARS, ~8,000 rules) and a schema's $refs (constrain.MAX_SCHEMA_REFS) are
bounded well inside it (~2.8 KiB a level)."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

COMPILE_STACK_BYTES = 64 << 20  # (a 64 KiB grammar's ~8,000 rules or 10,000 $refs need ~30 MiB; Windows commits
# the whole stack of each thread, and its CPython refuses 256 MiB and more: review r55, r59)
_COMPILE_THREADS = 2  # grammars compiled at once, process-wide (most are cached: a new one is rare)
_compile_lock = threading.Lock()
_compile_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _started_pool() -> concurrent.futures.ThreadPoolExecutor:
    """A pool whose workers are all started now (each submit starts one while the others wait)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=_COMPILE_THREADS, thread_name_prefix="grammar-compile")
    gate = threading.Event()
    try:
        for _ in range(_COMPILE_THREADS):
            pool.submit(gate.wait)
    except RuntimeError:
        gate.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    gate.set()
    return pool


def compile_pool() -> tuple[concurrent.futures.ThreadPoolExecutor, bool]:
    """The process's grammar-compile threads, started once with a COMPILE_STACK_BYTES stack.
    threading.stack_size is process-wide: set only while they are made (a thread per compile set it each
    time, and another request's thread started then got the big stack too: review r58; a pool per
    vocabulary queued every model's compiles behind each other and held a stack per model: review r59).
    A platform that refuses the size, or an OS that cannot map it now (a virtual-memory limit, review
    r57): a pool of default stacks for this compile only, the big one tried again at the next."""
    global _compile_pool
    with _compile_lock:
        if _compile_pool is not None:
            return _compile_pool, False
        try:
            old = threading.stack_size(COMPILE_STACK_BYTES)
        except (ValueError, RuntimeError):
            old = None
        try:
            if old is not None:
                try:
                    _compile_pool = _started_pool()
                    return _compile_pool, False
                except RuntimeError:
                    pass
        finally:
            if old is not None:
                threading.stack_size(old)
    return _started_pool(), True  # (the default stack: the bounds on grammar text and $refs still hold)


def compile_on(fn: Any, *args: Any) -> Any:
    """fn(*args) on a compile thread (blocking: callers are off the loop)."""
    pool, one_off = compile_pool()
    try:
        return pool.submit(fn, *args).result()
    finally:
        if one_off:
            pool.shutdown(wait=False)
