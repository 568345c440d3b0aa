"""Typed checks on JSON values this node did not write: peers' frames and adverts, data-dir files.

`json.loads` gives `True` where an int is expected as readily as `3` (bool is an int in Python), and a
sha256 field may hold anything; each reader used to write these checks again.
"""

from __future__ import annotations

import re
from typing import Any

SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a sha256 as peers and manifests write it


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_or_none(value: Any) -> int | None:
    """`value` when it is an int (not a bool), else None."""
    return value if is_int(value) else None


def is_sha256(value: Any) -> bool:
    """64 lower-case hex digits, as a sha256 is written on the wire and in manifests."""
    return isinstance(value, str) and SHA256_HEX.fullmatch(value) is not None
