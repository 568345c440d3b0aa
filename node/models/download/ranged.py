"""The first bytes of a file at its origin, by one HTTP Range request (a model's header).

`bytes=0-(n-1)`; a 206 must start at 0, a 200 (a server that ignores Range) is read only up to n
bytes and the connection dropped; fewer than n bytes is a failure. Redirects are not followed (a
redirect is a failed origin: the caller falls back to peers), so an advertised https origin cannot
send this node to a plain-http address on its LAN, loopback or link-local range. The body is read
raw (no decompression, a `Content-Encoding` other than identity is refused) and never past
`n` bytes whatever the server sends, so an origin cannot make us fill memory. Errors never show
the URL's query string.
"""

from __future__ import annotations

import aiohttp

from node.errors import DownloadFailed

from .fetch import content_range
from .urls import describe_error, display_url, http_error, resolve_url

_CHUNK = 1 << 20


async def async_fetch_prefix(url: str, n_bytes: int, *, timeout_s: float, magic: bytes = b"",
                             session: aiohttp.ClientSession | None = None) -> bytes:
    """The first n_bytes of the file at url (DownloadFailed with the reason otherwise). `magic`: what
    the file starts with; an answer that does not is dropped at its first bytes, not read to n_bytes
    (2026-12-07: an advert's origin, any large file, was downloaded whole up to the advertised
    length by every node of the swarm before its hash refused it)."""
    if n_bytes <= 0:
        raise DownloadFailed("nothing to fetch: the advertised header length is not positive")
    resolved = resolve_url(url)
    headers = {"Range": f"bytes=0-{n_bytes - 1}", "Accept-Encoding": "identity"}
    own = session is None
    client = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    try:
        async with client.get(resolved, headers=headers, allow_redirects=False, auto_decompress=False) as resp:
            if 300 <= resp.status < 400:
                raise DownloadFailed(f"{display_url(resolved)} answered HTTP {resp.status} (a redirect): "
                                     "redirects are not followed for a header")
            if resp.status == 206:
                first, _total = content_range(resp.headers.get("Content-Range"))
                if first != 0:
                    raise DownloadFailed(f"{display_url(resolved)} sent a range from byte {first}, asked from 0")
            elif resp.status != 200:
                raise DownloadFailed(f"{http_error(resp.status)} from {display_url(resolved)}")
            encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise DownloadFailed(f"{display_url(resolved)} sent the header {encoding}-encoded, asked identity")
            buf = bytearray()
            while len(buf) < n_bytes:  # never ask the stream for more than is still wanted
                chunk = await resp.content.read(min(_CHUNK, n_bytes - len(buf)))
                if not chunk:
                    break
                buf += chunk
                if magic and len(buf) >= len(magic) and not buf.startswith(magic):
                    raise DownloadFailed(f"{display_url(resolved)} is not a {magic.decode(errors='replace')} file "
                                         f"(it starts with {bytes(buf[:8])!r}): not read further")
            if len(buf) < n_bytes:
                raise DownloadFailed(f"{display_url(resolved)} sent {len(buf)} of {n_bytes} header bytes")
            return bytes(buf)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DownloadFailed(f"fetching the header from {display_url(resolved)} failed: {describe_error(exc)}") from exc
    finally:
        if own:
            await client.close()
