"""Hugging Face's side of a download: its endpoint, the user's token, what its answers say.

Read from Hugging Face's own variables (those its `huggingface-cli` and libraries read, not SwarmLLM
settings): `HF_ENDPOINT` (default https://huggingface.co; `hf://` URLs resolve against it),
`HF_TOKEN`, else the file `huggingface-cli login` writes (`$HF_TOKEN_PATH`, else
`$HF_HOME/token`, else `~/.cache/huggingface/token`). The token is sent as `Authorization: Bearer`
to the endpoint's origin only (never to another host: the HTTP client drops it on a redirect to
the CDN), and never logged or shown. Blocking (a file read): call `hub_headers` in an executor.
"""

from __future__ import annotations

import email.utils
import os
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node import const

HF_DEFAULT_ENDPOINT = "https://huggingface.co"


def hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")


def _origin(url: str) -> tuple[str, str, int | None]:
    parsed = urllib.parse.urlsplit(url)
    port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)
    return parsed.scheme, (parsed.hostname or "").lower(), port


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs share scheme, host and port (whatever HF_ENDPOINT says today)."""
    return _origin(a) == _origin(b)


def is_hub_url(url: str) -> bool:
    """Whether url is on the Hugging Face endpoint (the only host the token goes to)."""
    return _origin(url) == _origin(hf_endpoint())


def hf_token() -> str | None:
    """The user's Hugging Face token: HF_TOKEN, else huggingface-cli's token file; None if neither."""
    token = os.environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("HF_TOKEN_PATH") or (
        Path(os.environ["HF_HOME"]) / "token" if os.environ.get("HF_HOME") else
        Path.home() / ".cache" / "huggingface" / "token")
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def hub_headers(url: str) -> dict[str, str]:
    """`Authorization: Bearer <token>` for a URL on the Hugging Face endpoint when the user has a
    token; nothing otherwise (blocking: may read the token file)."""
    if not is_hub_url(url):
        return {}
    token = hf_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def refusal_hint(url: str, status: int, sent_token: bool) -> str:
    """What to do about a 401/403 from the Hugging Face endpoint ("" for other hosts/statuses)."""
    if status not in (401, 403) or not is_hub_url(url):
        return ""
    if sent_token:
        return (": the Hugging Face token (HF_TOKEN or huggingface-cli login) has no access to this repo "
                "(a gated model: accept its terms on its page with that account)")
    return (": the repo is gated or private; set HF_TOKEN to a Hugging Face token with access "
            "(or run `huggingface-cli login`)")


def linked_sha256(history: Any, headers: Mapping[str, str]) -> str | None:
    """The whole file's sha256 as the Hub states it: `X-Linked-Etag` (an LFS file's sha256, quoted),
    on the redirect to the CDN (`history`, aiohttp's) or on the answer itself."""
    for h in [*(r.headers for r in history or ()), headers]:
        etag = (h.get("X-Linked-Etag") or "").removeprefix("W/").strip('"').lower()
        if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag):
            return etag
    return None


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """A 429/503's `Retry-After` (seconds or an HTTP date) in seconds, at most
    DOWNLOAD_RETRY_AFTER_MAX_S; None when absent or unreadable."""
    value = (headers.get("Retry-After") or "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(seconds, const.DOWNLOAD_RETRY_AFTER_MAX_S))
