"""Partial models: the GGUF header and the tensors of some layers, fetched by Range requests
from the model's origin (layout.py: the directory and its manifest; fetch.py: the fetch)."""

from .fetch import FetchStats, async_fetch_parts, async_open_partial
from .layout import SUFFIX, Manifest, PartialStore, parts_for

__all__ = ["SUFFIX", "FetchStats", "Manifest", "PartialStore", "async_fetch_parts", "async_open_partial", "parts_for"]
