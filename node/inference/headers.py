"""A model's GGUF header over the peer link (MODEL_HEADER = 21) and from its origin.

Serving: any node holding M's file (whole or slices) answers `{sha256, offset}` with up to
`MODEL_HEADER_CHUNK_BYTES` of the header from that offset, `{sha256, offset, total, header_sha256}`
in the reply's JSON; an unknown model or a malformed request is an ERROR (the link stays).
Fetching: from the origin URL an advert names (one Range request), else holder by holder, chunk by
chunk; the bytes are checked against the header hash, size, layer count and architecture that
holder advertised, and a mismatch is refused (logged) before the next source is tried. Never more
than `MODEL_HEADER_MAX_BYTES` is accepted. Hashing, parsing and file reads run in executors.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from node import const
from node.errors import DownloadFailed, InvalidRequest, ModelNotFound, NodeError
from node.logs import kv
from node.models.catalog import MODEL_NAME_RE, ModelCatalog
from node.models.download.ranged import async_fetch_prefix
from node.models.download.urls import display_url
from node.models.gguf_meta import GgufHeader
from node.models.header import HeaderRefused, check_header, read_range
from node.net import Frame, FrameType, PeerLink
from node.values import is_int, is_sha256

log = logging.getLogger(__name__)

_NAME = MODEL_NAME_RE  # the rule the catalog makes names by
_ARCH = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MIN_CHUNK = 64 * 1024  # smallest chunk accepted before the header's end: no million-request trickle


@dataclass(frozen=True)
class HeaderAdvert:
    """What one peer advertises about a model it holds, as far as fetching its header goes."""

    node_id: str
    sha256: str
    name: str
    n_layers: int
    architecture: str | None
    header_sha256: str
    header_bytes: int
    size_bytes: int = 0
    origin_url: str | None = None
    servable: bool = False  # the peer serves it: a layer range, or whole and not paused

    @property
    def model_id(self) -> str:
        """The id every node gives this model: readable name + the FULL file's sha256[:8]."""
        return f"{self.name}-{self.sha256[:8]}"


def parse_advert(node_id: str, m: Mapping[str, Any], *, local_peer: bool = False) -> HeaderAdvert | None:
    """A HELLO model advert (untrusted) as a HeaderAdvert; None when it lacks or garbles a field.
    `local_peer`: the advert came over a direct link from this machine (`on_this_machine`), the
    only peer whose plain-http loopback origin is kept (see `_fetchable_origin`)."""
    sha, hsha, name = m.get("sha256"), m.get("header_sha256"), m.get("name")
    n_layers, n_bytes = m.get("n_layers"), m.get("header_bytes")
    if not (is_sha256(sha) and is_sha256(hsha)):
        return None
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        return None
    if not (is_int(n_layers) and 0 < n_layers <= 4096):
        return None
    if not (is_int(n_bytes) and 0 < n_bytes <= const.MODEL_HEADER_MAX_BYTES):
        return None  # a header we would refuse to hold: never fetched, from an origin or a peer
    arch = m.get("architecture")
    size = m.get("size_bytes")
    origin = m.get("origin_url")
    if not (isinstance(origin, str) and len(origin) <= 2048 and _fetchable_origin(origin, local_peer)):
        origin = None
    start, end = m.get("start"), m.get("end")
    servable = ((is_int(start) and is_int(end) and 0 <= start < end <= n_layers) or
                (m.get("whole") is True and not m.get("paused"))) and not m.get("loading")
    return HeaderAdvert(node_id, sha, name, n_layers, arch if isinstance(arch, str) and _ARCH.fullmatch(arch) else None,
                        hsha, n_bytes, size if is_int(size) and size >= 0 else 0,
                        display_url(origin) if origin else None, servable)


def on_this_machine(transport: str | None, address: str | None) -> bool:
    """Whether a connected peer's link comes from this machine: direct, from a loopback address
    (a snapshot's `address` is then the link's own remote host, never an address the peer claimed)."""
    if transport != "direct" or not address:
        return False
    try:
        return ipaddress.ip_address(address.rpartition(":")[0].strip("[]")).is_loopback
    except ValueError:
        return False


def _this_machine(host: str) -> bool:
    """Whether an origin's host names this machine in any spelling the connection would take:
    localhost and its subdomains, loopback and unspecified addresses, IPv4 in the forms inet_aton
    reads (127.1, 2130706433, 0x7f000001) and IPv4-mapped IPv6 (review r61: those passed for a remote
    host)."""
    name = host.rstrip(".").lower()
    if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _fetchable_origin(url: str, local_peer: bool) -> bool:
    """An origin a peer's advert may make this node fetch: https (the server's certificate is
    checked), or plain http only on loopback (a local mirror) and only from a peer on this machine
    (`local_peer`), whose loopback is ours. Any other http URL is ignored, so a member cannot point
    the swarm's nodes at plain-http services on their LANs (a GET with a Range header, whose answer
    is only hash-checked, is still a request we should not make for others), nor, from another
    machine, at this machine's own local services (2026-12-07: a remote member's advert naming
    http://127.0.0.1:PORT/PATH had every node GET its own loopback, each header retry again, as PEX
    already refused for loopback peer addresses). Loopback http from a local peer is acceptable: its
    mirror is this machine's (the tests' local origin server is one), the request is a single Range
    GET with no credentials, and its answer is refused unless it hashes to the advertised header.
    An https loopback origin is ours alike (a local server's certificate may be trusted). The fetch
    never follows a redirect (ranged.py), so an https origin cannot bounce us to an address this
    rule refuses."""
    try:
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname
    except ValueError:
        return False
    if not host or parsed.scheme not in ("http", "https"):
        return False
    if _this_machine(host):  # this machine's, https too (a local dev server's certificate may be trusted: mkcert)
        return local_peer
    return parsed.scheme == "https"



class HeaderServer:
    """Answers MODEL_HEADER requests from the files in this node's catalog."""

    def __init__(self, catalog: ModelCatalog):
        self.catalog = catalog

    async def async_handle(self, link: PeerLink, frame: Frame) -> Frame:
        """One chunk of a model's header; a NodeError (sent back as ERROR) otherwise."""
        sha, offset = frame.header.get("sha256"), frame.header.get("offset", 0)
        if not is_sha256(sha):
            raise InvalidRequest("MODEL_HEADER needs 'sha256': 64 lower-case hex digits")
        if not is_int(offset) or offset < 0:
            raise InvalidRequest("MODEL_HEADER 'offset' must be a non-negative integer")
        entry = self.catalog.by_sha(sha)
        if entry is None or not entry.has_file or not entry.header_bytes:
            raise ModelNotFound(f"no file of model {sha[:16]} on this node")
        total = entry.header_bytes
        if offset >= total:
            raise InvalidRequest(f"MODEL_HEADER offset {offset} is past the header's {total} bytes")
        n = min(const.MODEL_HEADER_CHUNK_BYTES, total - offset)
        data = await asyncio.get_running_loop().run_in_executor(None, read_range, entry.header_path, offset, n)
        log.debug("DIAG: served model header chunk %s", kv(peer_id=link.short_id, model=entry.id, offset=offset,
                                                          bytes=len(data)))
        return Frame(FrameType.MODEL_HEADER, {"sha256": sha, "offset": offset, "total": total,
                                              "header_sha256": entry.header_sha256}, data)


class HeaderFetcher:
    """Gets a model's header bytes from its origin or a holder, checked against the advert."""

    def __init__(self, peers: Any, *, max_bytes: int = const.MODEL_HEADER_MAX_BYTES):
        self.peers = peers  # PeerManager: async_request(node_id, frame, timeout_s)
        self.max_bytes = max_bytes

    async def async_fetch(self, adverts: list[HeaderAdvert]) -> tuple[bytes, GgufHeader, str, HeaderAdvert]:
        """(header bytes, parse, where from: "origin" | the holder's short id, the advert they were
        checked against); DownloadFailed when every source failed or was refused."""
        errors = []
        for advert in self._origins(adverts):
            try:
                if advert.header_bytes > self.max_bytes:  # parse_advert refuses these; never fetch one
                    raise HeaderRefused(f"advertised header of {advert.header_bytes} bytes is over the "
                                        f"{self.max_bytes}-byte cap")
                data = await async_fetch_prefix(advert.origin_url, advert.header_bytes, magic=b"GGUF",
                                                timeout_s=const.MODEL_HEADER_TIMEOUT_S)
                return data, await self._async_check(data, advert, "origin"), "origin", advert
            except (DownloadFailed, HeaderRefused) as exc:
                errors.append(f"origin: {exc.message}")
                log.warning("DIAG: model header from origin failed, trying peers %s", kv(
                    model=advert.model_id, url=advert.origin_url, error=exc.message))
        for advert in adverts:
            source = advert.node_id[:8]
            try:
                data = await self._async_from_peer(advert)
                return data, await self._async_check(data, advert, source), source, advert
            except (NodeError, HeaderRefused) as exc:
                errors.append(f"{source}: {exc.message}")
                log.warning("DIAG: model header refused or failed %s", kv(
                    model=advert.model_id, peer_id=source, error=exc.message))
        raise DownloadFailed("no source gave a valid header (" + "; ".join(errors[-4:]) + ")")

    @staticmethod
    def _origins(adverts: list[HeaderAdvert]) -> list[HeaderAdvert]:
        seen: set[tuple[str, str]] = set()
        out = []
        for a in adverts:
            if a.origin_url and (a.origin_url, a.header_sha256) not in seen:
                seen.add((a.origin_url, a.header_sha256))
                out.append(a)
        return out

    async def _async_check(self, data: bytes, advert: HeaderAdvert, source: str) -> GgufHeader:
        started = time.monotonic()
        header = await asyncio.get_running_loop().run_in_executor(
            None, lambda: check_header(data, header_sha256=advert.header_sha256, n_layers=advert.n_layers,
                                       architecture=advert.architecture, max_bytes=self.max_bytes))
        log.info("DIAG: model header fetched %s", kv(model=advert.model_id, source=source, bytes=len(data),
                                                    check_ms=round((time.monotonic() - started) * 1000, 1)))
        return header

    async def _async_from_peer(self, advert: HeaderAdvert) -> bytes:
        total = advert.header_bytes
        if total > self.max_bytes:
            raise HeaderRefused(f"advertised header of {total} bytes is over the {self.max_bytes}-byte cap")
        buf = bytearray()
        while len(buf) < total:
            offset = len(buf)
            reply = await self.peers.async_request(
                advert.node_id, Frame(FrameType.MODEL_HEADER, {"sha256": advert.sha256, "offset": offset}),
                timeout_s=const.MODEL_HEADER_TIMEOUT_S)
            h = reply.header
            expected = min(const.MODEL_HEADER_CHUNK_BYTES, total - offset)
            if reply.type != FrameType.MODEL_HEADER or h.get("sha256") != advert.sha256 or \
                    h.get("offset") != offset or h.get("total") != total:
                raise HeaderRefused(f"reply does not match the request (offset {h.get('offset')!r}, "
                                    f"total {h.get('total')!r}, advertised {total})")
            least = min(expected, _MIN_CHUNK)  # a holder's chunk size may differ, not be made tiny
            if not least <= len(reply.payload) <= expected:
                raise HeaderRefused(f"chunk of {len(reply.payload)} bytes at {offset}, expected {least}..{expected}")
            buf += reply.payload
        return bytes(buf)
