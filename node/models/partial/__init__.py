"""Partial models: the GGUF header and the tensors of some layers, fetched by Range requests
from the model's origin or from a peer holding them (layout.py: the directory and its manifest;
fetch.py: from the origin; peers.py: from a peer, checked against the origin)."""

from .fetch import FetchStats, async_fetch_parts, async_open_partial
from .layout import SUFFIX, Manifest, PartialStore, parts_for
from .peers import PartSource, PeerFetchStats, SpotCheckFailed, async_fetch_parts_from, async_spot_check_held
from .session import origin_session

__all__ = ["SUFFIX", "FetchStats", "Manifest", "PartSource", "PartialStore", "PeerFetchStats", "SpotCheckFailed",
           "async_fetch_parts", "async_fetch_parts_from", "async_open_partial", "async_spot_check_held", "origin_session",
           "parts_for"]
