"""Process-wide settings that must be in place before torch or llama.cpp start their thread pools."""

from __future__ import annotations

import os

# OpenMP (torch's intra-op pool, llama.cpp's threads) spins after each parallel region before it
# sleeps; libgomp's default spin is long. When several nodes share a machine (loopback swarms,
# tests) a pipeline hands work from process to process, and the previous hop's spinning threads
# take the cores the next hop needs: bench/pipeline_bench.py measured 3 segments at 26 tok/s with
# the default spin and 49 tok/s with 20000, with one segment unchanged (85 vs 84 tok/s).
GOMP_SPINCOUNT_DEFAULT = "20000"


def configure_process() -> None:
    """Call first thing in an entry point (before torch is imported); the user's env wins."""
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT_DEFAULT)
