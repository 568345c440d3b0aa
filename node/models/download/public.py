"""Whether a finished download's origin is public: anyone could fetch the file there, so a peer may
take its layers from this node while it is not loaded (wholeparts.held_files). Checked once, when a
download completes, off its critical path (the model is served meanwhile, as not public):

- the URL the user gave has no query string (a signed S3/CDN link carries its credentials there;
  the Hub's own `?download=true` is none) and no `user:pass@`;
- its host is not loopback, private, link-local or otherwise not global (a LAN server: every
  address the name resolves to must be global), unless the node is told LAN origins count
  (NodeConfig `public_lan_origins`, for tests and a mirror every member reaches);
- the file asked for without credentials (the user's Hugging Face token, hub.py, or none: 2026-12-07,
  review r31, a download that sent no token was not asked, so a mirror on a global name redirecting
  the download to a LAN store had its file shared), following redirects to global hosts only (a hop to a LAN, loopback or link-local
  host is not asked and makes it not public, unless `public_lan_origins`: 2026-12-07, every hop
  after the first was asked, so a private mirror sending strangers to a LAN store made its file
  public, and any origin had the node request its own local services; each connection the check
  makes refuses a name resolving to an address that is not global, `_GlobalOnlyResolver`:
  2026-12-07, the request looked the name up again after the check, so DNS rebinding reached
  127.0.0.1) (a HEAD, then a GET of one byte where it redirects, or where the HEAD is refused,
  405: 2026-12-07, such an origin was not public for good), comes back: a 2xx that is no web page and has the downloaded file's size (Content-Range
  or Content-Length, else the X-Linked-Size of the Hub's 302 to its CDN). A 401, 403 or 404 (a
  private or gated repo), or a login page (an SSO before a private mirror: a redirect to another
  host, then a 200 text/html; 2026-12-07: any redirect off the host counted as public) is not. Whether a token went is the caller's to say
  (origin_checks.py: found when the download ends, recorded with an `unchecked` result), never
  inferred here from this process's environment, nor the redirect rule from today's HF_ENDPOINT:
  2026-12-07, a check made again at a later start without HF_TOKEN (or with another HF_ENDPOINT)
  found "no token sent" and recorded a private repo's file public, without asking anyone.

A check that could not be made (DNS, a timeout after DOWNLOAD_PUBLIC_CHECK_S, a refused or dropped
connection, the Hub's 5xx or 429) is neither: None, recorded "unchecked" (not shared: privacy first)
and made again at the node's next start (origin_checks.py; 2026-12-07: it was "not public" for good,
so a download finished during a network blip was never shared unloaded). A certificate that fails
its check right after the download (the network that just fetched the file) is the origin's: not
public, for good (`tls_certificate`); at a check made again at a later start (`recheck`) it may be
that network's (a captive portal, an HTTPS-inspecting proxy, a wrong clock): unchecked, asked again
at the next start (2026-12-07, review r28: not public for good there too). (Before 2026-12-06 every
download with an origin was handed out, a private Hugging Face repo's too.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Mapping

import aiohttp
import aiohttp.abc

from node import const
from node.logs import kv

from .urls import display_url, signed_query

log = logging.getLogger(__name__)

_MAX_HOPS = 5  # the Hub's own redirects followed by the check


# IPv6 forms that carry an IPv4 address (2026-12-07, review r31: only ::ffff:a.b.c.d was unwrapped, so
# NAT64's 64:ff9b::a00:1, 10.0.0.1 on an IPv6-only network, counted as global): the well-known NAT64
# prefix is judged by its low 32 bits, 6to4 by its embedded address (ip.sixtofour); the deprecated
# IPv4-compatible (::/96) and IPv4-translated (::ffff:0:0:0/96) forms, local-use NAT64 (RFC 8215,
# the IPv4 address anywhere in it) and Teredo are not global
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NOT_GLOBAL_V6 = tuple(ipaddress.IPv6Network(n) for n in
                       ("::/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "2001::/32"))


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def _global(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if (v4 := _embedded_v4(ip)) is not None:
            ip = v4
        elif any(ip in net for net in _NOT_GLOBAL_V6):
            return False
    return ip.is_global and not ip.is_multicast


def _counts_as_global(address: str, port: int) -> bool:
    """Whether the check may count `address`:`port` as a global host: `_global(address)`. The one
    test-only allowance (a test replaces this function, so that a server on 127.0.0.1 stands for a
    global host): no setting, option or answer from the network reaches it."""
    return _global(address)


async def _async_host_public(host: str, port: int) -> bool:
    """Whether every address the host resolves to is a global one (a name resolving to a LAN,
    loopback or link-local address is not)."""
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [info[4][0] for info in infos]
    return bool(addresses) and all(_counts_as_global(str(a), port) for a in addresses)


async def async_host_global(host: str, port: int) -> bool:
    """Whether every address `host` resolves to is global (an IP literal is not resolved); OSError
    when a name does not resolve. What a partial model's origin may redirect to (partial/session.py)."""
    return await _async_host_public(host, port)


class NotGlobalAddress(OSError):
    """A host the check was about to connect to resolved to an address that is not global."""

    def __init__(self, message: str):
        super().__init__(None, message)  # (as strerror: what aiohttp's connection error shows)


class _GlobalOnlyResolver(aiohttp.abc.AbstractResolver):
    """The check's connections' resolver (aiohttp's threaded one), refusing a name any of whose
    addresses is not global: what is checked is what is connected to. The check looks a host up
    before asking it, and the connection looked it up again: a name answering a global address
    first and 127.0.0.1 or a LAN address next (DNS rebinding) had the check ask this machine's or
    the LAN's services, and call a file public that only this node could fetch (2026-12-07). An IP
    literal is not resolved by aiohttp; the check's own look-up decides it."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        hosts = await self._inner.resolve(host, port, family)
        if not all(_counts_as_global(str(h["host"]), port) for h in hosts):
            raise NotGlobalAddress(f"{host} resolves to an address that is not global")
        return hosts

    async def close(self) -> None:
        await self._inner.close()


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _is_the_file(status: int, headers: Mapping[str, str], size: int | None, linked: int | None) -> bool:
    """Whether a 2xx answered with the file: no web page (a login page is text/html) and the file's
    size: Content-Range's total (a 206 to the first byte), else Content-Length, else the X-Linked-Size
    a redirect gave (the Hub's 302); no size at all is not the file."""
    if headers.get("Content-Type", "").split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml"):
        return False
    got = _int(headers.get("Content-Range", "").rpartition("/")[2]) if status == 206 \
        else _int(headers.get("Content-Length"))
    return size is not None and (got if got is not None else linked) == size


async def _async_ask(session: aiohttp.ClientSession, url: str, first: bool) -> tuple[int, Mapping[str, str]] | None:
    """(status, headers) of one hop asked without credentials, its body not read: the URL the user
    gave gets a HEAD, a hop a redirect named a GET of the first byte (a CDN's presigned link may
    answer only the method it was signed for), and so does an origin refusing HEAD (405: it was
    not public for good until 2026-12-07, though anyone could GET the file). None: the hop's name
    resolved to an address that is not global when connecting (_GlobalOnlyResolver)."""
    method = "HEAD" if first else "GET"
    while True:
        headers = {"Accept-Encoding": "identity"}
        if method == "GET":
            headers["Range"] = "bytes=0-0"
        try:
            async with session.request(method, url, allow_redirects=False, headers=headers) as resp:
                status, answer = resp.status, resp.headers
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, NotGlobalAddress):
                return None
            raise
        if method == "HEAD" and status == 405:
            method = "GET"
            continue
        return status, answer


async def _async_fetchable_without_token(url: str, size: int | None, lan_ok: bool) -> bool | None:
    """Asked without credentials, following redirects (at most _MAX_HOPS, to global hosts only unless
    `lan_ok`): public only when the last answer is a 2xx with the file (`size` bytes, no web page:
    `_is_the_file`). The URL gets a HEAD (refused, 405: a GET of its first byte), where it redirects
    a GET of the first byte (a CDN's presigned link may answer only the method it was signed for).
    A 401, 403 or 404 (private, gated), a login page on another host (an SSO before a private
    mirror), another size, a redirect to a host that is not global (a LAN storage host serving
    anyone inside the LAN, or this machine's own services: not asked), a host whose name resolves
    to one when connecting (DNS rebinding: not connected to): not public; a 5xx or 429 (busy, down)
    says nothing: None. (Until 2026-12-07 any redirect to another host counted as public: a private
    origin sending a stranger to its login page did; then, for a day, every hop after the first was
    asked whatever its host, so a private mirror redirecting to a 10.x store made its file public.)"""
    asked, linked = url, None
    timeout = aiohttp.ClientTimeout(total=const.DOWNLOAD_PUBLIC_CHECK_S)
    connector = None if lan_ok else aiohttp.TCPConnector(resolver=_GlobalOnlyResolver())
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for _hop in range(_MAX_HOPS):
            hop = urllib.parse.urlsplit(url)
            answer = None
            if lan_ok or await _async_host_public(hop.hostname or "", hop.port or (80 if hop.scheme == "http" else 443)):
                answer = await _async_ask(session, url, url == asked)
            if answer is None:
                log.debug("DIAG: origin check not asking a host that is not global %s", kv(url=display_url(url)))
                return False
            status, headers = answer
            if status >= 500 or status == 429:
                return None
            if 200 <= status < 300:
                return _is_the_file(status, headers, size, linked)
            linked = _int(headers.get("X-Linked-Size")) or linked
            where = headers.get("Location")
            if status not in (301, 302, 303, 307, 308) or not where:
                return False  # 401/403 (private, gated), 404 (a private repo to a stranger)
            url = urllib.parse.urljoin(url, where)
    return False


async def async_origin_public(url: str, *, sent_token: bool, size: int | None = None,
                              lan_ok: bool = False, recheck: bool = False) -> bool | None:
    """Whether the file at `url` (as the user gave it, resolved) is public; None when that could not
    be found out now (the network, not the file: ask again later); never raises. The file is asked
    for without credentials, and is public only if what comes back is `size` bytes (the downloaded
    file's; None: unknown, so not public), whether or not the download sent a Hugging Face token
    (`sent_token`: True when that is not known; it only names a failure, `needs_token`). Until
    2026-12-07 (review r31) a download without a token was public with no request: a mirror on a
    global name redirecting to a LAN store had its file shared. `recheck`: a check made again at a later start, not right after the
    download (a certificate failure there is None, not False)."""
    parsed = urllib.parse.urlsplit(url)
    why = None
    unchecked = False
    try:
        if signed_query(url):
            why = "signed"  # a query string: a signed link's credentials (not the Hub's ?download=true)
        elif parsed.username is not None or parsed.password is not None:
            why = "userinfo"
        elif not lan_ok and not await asyncio.wait_for(
                _async_host_public(parsed.hostname or "", parsed.port or 443), const.DOWNLOAD_PUBLIC_CHECK_S):
            why = "lan_host"
        else:
            # asked whether a token went or not: the download followed redirects, and a mirror on a
            # global name may send it to a LAN store (2026-12-07, review r31: without a token it was
            # public with no request; `sent_token` only names the failure)
            fetchable = await asyncio.wait_for(_async_fetchable_without_token(url, size, lan_ok), const.DOWNLOAD_PUBLIC_CHECK_S)
            if fetchable is None:
                why, unchecked = "hub_unavailable", True
            elif not fetchable:
                why = "needs_token" if sent_token else "not_fetchable"
    except ssl.SSLCertVerificationError:  # (aiohttp's ClientConnectorCertificateError too)
        # right after the download, not public, for good, not "unchecked": the download went
        # through, so a host on the way to the file (the origin, a redirect's CDN) showed the check,
        # on the same network, a certificate this node does not trust; whoever else fetches the file
        # there meets the same certificate, and nothing says strangers can fetch it. A certificate is
        # not fixed in a blip, as a timeout is. (It counted as a ValueError before 2026-12-07: not
        # public, but said "check_failed", as if the URL could not be asked.) At a later start the
        # network may be another one (a captive portal, an HTTPS-inspecting office proxy, a clock
        # set wrong): nothing about the origin, so unchecked, asked again at the next start
        # (2026-12-07, review r28: it was not public for good there too)
        why, unchecked = "tls_certificate", recheck
    except ValueError as exc:  # a URL that cannot be asked (aiohttp's InvalidURL too): not public, for good
        why = f"check_failed:{type(exc).__name__}"
    except (TimeoutError, OSError, aiohttp.ClientError) as exc:  # DNS, a refusal, a drop: asked again later
        why, unchecked = f"check_failed:{type(exc).__name__}", True
    log.info("DIAG: model origin checked %s", kv(url=display_url(url), public=None if unchecked else why is None,
                                                 why=why, unchecked=unchecked or None))
    return None if unchecked else why is None
