"""Process-wide settings that must be in place before torch or llama.cpp start their thread pools."""

from __future__ import annotations

import os

from node import const

# OpenMP (torch's intra-op pool, llama.cpp's threads) spins after each parallel region before it
# sleeps; libgomp's default spin is long. When several nodes share a machine (loopback swarms,
# tests) a pipeline hands work from process to process, and the previous hop's spinning threads
# take the cores the next hop needs: bench/pipeline_bench.py measured 3 segments at 26 tok/s with
# the default spin and 49 tok/s with 20000, with one segment unchanged (85 vs 84 tok/s).
GOMP_SPINCOUNT_DEFAULT = "20000"


def configure_process() -> None:
    """Call first thing in an entry point (before torch is imported); the user's env wins."""
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT_DEFAULT)
    raise_open_files_limit()


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise the soft limit of open files towards the hard one (at most OPEN_FILES_SOFT_LIMIT_MAX);
    never lowers it. Each API connection, peer link and model file is a descriptor: at the usual
    soft limit (1024 on Linux, 256 on macOS) 300 sockets a local app left open made every accept()
    fail with EMFILE, so no other client was served (and the node could open no file). Returns
    (before, after), or None where there is no such limit (Windows) or it cannot be changed."""
    try:
        import resource
    except ImportError:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = const.OPEN_FILES_SOFT_LIMIT_MAX if hard == resource.RLIM_INFINITY else min(hard, const.OPEN_FILES_SOFT_LIMIT_MAX)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return soft, want
        return soft, soft
    except (OSError, ValueError):  # e.g. macOS refuses more than its kern.maxfilesperproc
        return None
