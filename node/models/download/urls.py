"""Download URLs: which are accepted, how they are shown, and the file name they give.

`hf://owner/repo/path/file.gguf[@revision]` is Hugging Face's resolve URL (on HF_ENDPOINT, hub.py); only http(s) otherwise.
A URL is never shown or logged with its query string or fragment (signed URLs carry credentials
there), also inside error texts.
"""

from __future__ import annotations

import http
import re
import ssl
import sys
import urllib.parse

from node.errors import InvalidRequest

from .hub import hf_endpoint, is_hub_url

_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\.gguf$")
_RESERVED_NAMES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def resolve_url(url: str) -> str:
    """The HTTP(S) URL to fetch: `hf://owner/repo/path/file.gguf[@revision]` becomes Hugging Face's
    resolve URL; http(s) URLs pass; anything else is an InvalidRequest."""
    if url.startswith("hf://"):
        spec = url[len("hf://"):]
        spec, _, revision = spec.partition("@")
        parts = [p for p in spec.split("/") if p]
        if len(parts) < 3:
            raise InvalidRequest("hf:// URLs are hf://owner/repo/path/to/file.gguf[@revision]", param="url")
        owner, repo, path = parts[0], parts[1], "/".join(parts[2:])
        quoted = "/".join(urllib.parse.quote(p) for p in (owner, repo))
        # a revision's `/` (refs/pr/1) encoded, as huggingface_hub does: the Hub resolves it only so
        rev = urllib.parse.quote(revision or "main", safe="")
        return f"{hf_endpoint()}/{quoted}/resolve/{rev}/{urllib.parse.quote(path)}"
    try:
        parsed = urllib.parse.urlsplit(url)
        host, _port = parsed.hostname, parsed.port  # a port past 65535 or not a number: ValueError
    except ValueError as exc:
        raise InvalidRequest(f"url is not a valid URL: {exc}", param="url") from exc
    if parsed.scheme not in ("http", "https") or not parsed.netloc or not host:
        raise InvalidRequest("url must be http(s)://… or hf://owner/repo/file.gguf", param="url")
    try:
        host.encode("idna")  # what the HTTP client will do: labels of 1..63 characters
    except UnicodeError as exc:
        raise InvalidRequest(f"url's host name is not a valid host name ({len(host)} characters)", param="url") from exc
    return url


def signed_query(url: str) -> bool:
    """Whether the URL's query string may carry credentials (a signed link's): any query, except the
    Hub's own browser link `…/resolve/main/f.gguf?download=true` (2026-12-06: it counted as signed)."""
    query = urllib.parse.urlsplit(url).query
    if not query:
        return False
    return not (is_hub_url(url) and urllib.parse.parse_qsl(query, keep_blank_values=True) == [("download", "true")])


def display_url(url: str) -> str:
    """The URL without query string or fragment (signed URLs carry credentials there)."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = f"{host}:{parsed.port}" if parsed.port else host  # user:password@ is dropped too
    return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, "", ""))


def file_name_for(url: str, name: str | None) -> str:
    """The file name in models/: the given one, else the URL's last path segment."""
    candidate = name or urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not candidate.endswith(".gguf"):
        candidate += ".gguf"
    if not _NAME_OK.match(candidate) or candidate.startswith("..") or \
            candidate.split(".")[0].upper() in _RESERVED_NAMES:
        raise InvalidRequest(f"cannot use {candidate!r} as a model file name (letters, digits, . _ + - and "
                             "a .gguf suffix)", param="filename")
    return candidate


def http_error(status: int) -> str:
    """`HTTP 403 Forbidden`: the status and its standard phrase, never the server's own reason
    text (the origin's words, shown in logs, the job and the diagnostics report: a misconfigured
    or hostile origin put a token or a user's name there)."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP {status} {phrase}".strip()


_QUERY = re.compile(r"[?#][^\s'\")>]*")


def describe_error(exc: BaseException) -> str:
    """An attempt's error for logs and the job: type and text, never a URL's query string."""
    text = _QUERY.sub("?…", str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cert_failure(exc: BaseException, url: str) -> str | None:
    """What to say of a TLS certificate that failed its check (not trusted, expired, another host's
    name: ssl's SSLCertVerificationError, which aiohttp's ClientConnectorCertificateError is), with
    the host and OpenSSL's reason; None for any other error. Such a failure is not tried again: a
    certificate does not fix itself between attempts (2026-12-07: it was, DOWNLOAD_RETRIES times, and
    said only after a minute of backing off)."""
    if not isinstance(exc, ssl.SSLCertVerificationError):
        return None
    cert = getattr(exc, "certificate_error", exc)  # aiohttp's error wraps ssl's
    reason = getattr(cert, "verify_message", None) or getattr(cert, "reason", None) or "certificate verify failed"
    host = getattr(exc, "host", None) or urllib.parse.urlsplit(url).hostname or "the origin"
    proxy = ("; if a proxy or security software inspects HTTPS on this network, set SSL_CERT_FILE to the "
             "CA bundle (a PEM file) it needs and start the node again") if sys.platform.startswith("linux") else ""
    return f"the TLS certificate of {host} failed its check ({reason}): not tried again{proxy}"
