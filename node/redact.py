"""Redaction of network addresses, host names and paths for reports pasted in public.

Every IP or host name becomes `<public-ip-xxxx>`, `<private-ip-xxxx>` or `<host-xxxx>`. The tag
is an HMAC of the address under a salt made fresh for each report, so two occurrences of one host
share a tag within a report and mean nothing across reports. Ports, node ids and transport
survive; loopback is exempt; file paths become `<path>`, e-mail addresses `<email>`, MAC addresses
`<mac>`, the user's login and full name `<user>` (also inside a model's name). In both forms (redacted and full) the given secrets (the API key) become `<api-key>`, and a
URL loses its user, password, query string and fragment (signed URLs carry credentials there).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets

# Dotted names ending in one of these are treated as host names in free text.
_HOST_SUFFIXES = (
    "local", "lan", "home", "internal", "localdomain", "corp", "intranet", "arpa",
    "com", "net", "org", "io", "dev", "ai", "app", "cloud", "co", "edu", "gov", "info", "me",
    "uk", "de", "fr", "nl", "jp", "cn", "th", "us", "eu", "ru", "br", "in", "au", "ca", "ch",
)
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}

_IPV4 = r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.]*\d)"
# IPv6: at least two colons among hex groups, optional zone; validated by ipaddress afterwards.
_IPV6 = r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9A-Fa-f]{0,4})(?:%[\w.]+)?(?![\w:]|\.\d)"
_HOSTNAME = (
    r"(?<![\w./-])((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+(?:"
    + "|".join(_HOST_SUFFIXES)
    + r"))\.?(?![\w-])"
)
# Any dotted name followed by :port is a host, whatever its suffix (gpu-box.example.xyz:8810).
_HOST_WITH_PORT = r"(?<![\w./-])((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z][A-Za-z0-9-]*)(?=:\d{1,5}\b)"
# A URL's scheme starts where no scheme character precedes it: a `\b` start let every letter of a
# long run ("a.a.a…", a GGUF's 64 KB architecture string quoted in an error) scan the run again for
# `://`, quadratic (a 17 s report, a 50 s event loop stall; review r67, 2026-12-07). The run's leading
# digits and `+.-` join the scheme, kept as written: `-https://ana:pw@…`, `...https://…?sig=` and
# `1.https://…` lost no password, query or path once the scheme had to start the run (review r70)
_SCHEME_AT = r"(?<![a-zA-Z0-9+.-])[0-9+.-]*[a-zA-Z][a-zA-Z0-9+.-]*://"
_SCHEME = rf"({_SCHEME_AT})"
# scheme://[user[:password]@]host: the user part is dropped (a password in a URL must not survive)
# ...and its path: the directories name an account, a bucket, a repository (`/ana-garcia/private/...`)
_URL_HOST = rf"{_SCHEME}(?:[^/\s@]*@)?(\[[^\]]+\]|[^/\s:?#]+)(:\d{{1,5}})?(/[^\s?#'\"<>]*)?"
_OWN_API = re.compile(r"/(?:v1|api|health|metrics)(?:[/?#]|$)")  # URL paths of our own API: kept (whole
# segments: `/v1beta/...`, `/v1data/ana/...` are not ours)
# A directory may have spaces in its name (/home/Ana Maria de la Cruz/..., C:\Program Files (x86)\...).
# After a backslash any words joined by single spaces are one segment when a backslash follows (prose
# has none); after a slash the words past the first must start with a letter ("x.gguf 12 MB/s" and
# "x.gguf in 2.1 s at 12.5 tok/s" are a file and figures, not a directory). The last segment stops
# at a space. Over-redaction is the safe side: a name must not survive.
# A name on disk may hold any character but a slash: `:` (`file:`, joined onto a relative path), `\`
# (a UNC path after a POSIX one), `%`, `~`... all stay inside the match; a sentence's punctuation at
# its end is given back (`_path_sub`).
_SEG = r"[^\s/'\"`<>()\[\]{},;|]"
# A path starts the text or follows a space, `=`, a quote or backtick, a bracket, `,`, `;` or `|`: `0.93×/1.00×/1.07×`
# and `50%/60%/70%` are figures, not a path after `×` or `%`
_POSIX_PATH = rf"(?<![^\s=('\"\[,`;{{|])/(?:{_SEG}+(?: [A-Za-z]{_SEG}*)*/)*{_SEG}+/?"
_WIN_NAME = r'[^\\/\s<>:"|?*]'  # no Windows name has <>:"|?*
# Separators may come doubled: an OSError's text quotes the file name with repr ('C:\\\\Users\\\\...').
_WIN_TAIL = rf"(?:{_WIN_NAME}+(?: {_WIN_NAME}+)*\\+)*{_WIN_NAME}*"
_WIN_PATH = (rf"\b[A-Za-z]:(?:\\+{_WIN_TAIL}"
             rf"|/(?:{_WIN_NAME}+(?: [A-Za-z]{_WIN_NAME}*)*/)*{_WIN_NAME}*)"
             rf"|(?<![\w\\])\\{{2,}}{_WIN_NAME}+(?:\\+{_WIN_TAIL})?")  # \\server\share\... (UNC)
_FILE_URL = r"\bfile:/+[^\s'\"<>]*"
_EMAIL = r"(?<![\w.+-])[\w.+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?!\w)"
_MAC = r"(?<![\w:-])(?:[0-9A-Fa-f]{2}([:-]))(?:[0-9A-Fa-f]{2}\1){4}[0-9A-Fa-f]{2}(?![\w:-])"
# A URL's user[:password]@ and its ?query#fragment: credentials, dropped in both forms.
_URL_CREDS = rf"{_SCHEME}[^/\s@]*@"
# (the query is optional, so that a URL without one is matched, not scanned again from each `://` in it)
_URL_QUERY = rf"({_SCHEME_AT}[^\s?#'\"<>]*)([?#][^\s'\"<>]*)?"

_RE_IPV6 = re.compile(_IPV6)
_RE_IPV4 = re.compile(_IPV4)
_RE_HOST = re.compile(_HOSTNAME, re.IGNORECASE)
_RE_HOST_PORT = re.compile(_HOST_WITH_PORT)
_RE_URL_HOST = re.compile(_URL_HOST)
_RE_PATH = re.compile(f"{_WIN_PATH}|{_POSIX_PATH}")
_RE_FILE_URL = re.compile(_FILE_URL)
_RE_EMAIL = re.compile(_EMAIL)
_RE_MAC = re.compile(_MAC)
_RE_URL_CREDS = re.compile(_URL_CREDS)
_RE_URL_QUERY = re.compile(_URL_QUERY)
_RE_TAG = re.compile(r"(<(?:public-ip|private-ip|host)-[0-9a-f]{4}>)")
_USER_NAME_MIN = 3  # shorter names are words of the report itself
# Account names that name no person, and words of the report itself: a login `root`, `node` or
# `admin` made `<user>` of every such word (`node_id=` became `<user>_id=` in every line)
_GENERIC_NAMES = frozenset({
    "root", "admin", "administrator", "user", "users", "guest", "default", "public", "owner", "nobody",
    "ubuntu", "debian", "fedora", "centos", "ec2-user", "runner", "vagrant", "docker", "test", "dev",
    "home", "node", "swarm", "swarmllm", "model", "models", "peer", "peers", "relay", "data", "app",
    "server", "local", "shared", "system", "service", "daemon", "layer", "layers", "cache", "host",
})
_TRAILING = ".,:;!?"  # a sentence's punctuation after a path is not part of it


def _url_path(path: str) -> str:
    """A URL's path without its directories (`/…/x.gguf`); our own API's paths and one segment kept."""
    if _OWN_API.match(path) or path.count("/") < 2:
        return path
    return "/…/" + path.rsplit("/", 1)[1]


def _tail(value: str) -> str:
    """The sentence's punctuation a path match took with it (given back after `<path>`)."""
    return value[len(value.rstrip(_TRAILING)):]
_RE_BRACKETED_V6 = re.compile(r"\[([0-9A-Fa-f:.%\w]+)\]")


class Redactor:
    """Replaces addresses with salted, kind-naming tags; one instance per report."""

    def __init__(self, *, enabled: bool = True, secrets_to_hide: list[str] | None = None,
                 known_hosts: list[str] | None = None, user_names: list[str] | None = None,
                 salt: bytes | None = None):
        self.enabled = enabled
        self._salt = salt or secrets.token_bytes(16)
        self._secrets = [s for s in (secrets_to_hide or []) if s]
        # the user's login and full name, in any text (a model named after its owner's file name)
        names = sorted({n.lower() for n in (user_names or [])
                        if len(n) >= _USER_NAME_MIN and n.lower() not in _GENERIC_NAMES}, key=len, reverse=True)
        # (`_` joins words too: a login `max` made `<user>_concurrent=` of `max_concurrent=`)
        self._re_user = re.compile("(?<![A-Za-z0-9_])(?:" + "|".join(map(re.escape, names)) + ")(?![A-Za-z0-9_])",
                                   re.IGNORECASE) if names else None
        # single-label names (this machine's hostname, peers' names) that no regex can spot
        self._known_hosts = sorted({h for h in (known_hosts or []) if h and h.lower() not in _LOOPBACK_NAMES},
                                   key=len, reverse=True)

    def _tag(self, value: str) -> str:
        digest = hmac.new(self._salt, value.lower().encode(), hashlib.sha256).hexdigest()
        return digest[:4]

    def ip(self, text: str) -> str:
        """Redact one IP address (v4 or v6, optional zone); loopback and unspecified kept."""
        bare = text.split("%", 1)[0]
        try:
            addr = ipaddress.ip_address(bare)
        except ValueError:
            octets = bare.split(".")
            if len(octets) != 4 or not all(o.isdigit() for o in octets):
                return text
            try:  # 192.168.001.010: leading zeros are still an address to hide
                addr = ipaddress.ip_address(".".join(str(int(o)) for o in octets))
            except ValueError:
                return text
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if not self.enabled or addr.is_loopback or addr.is_unspecified:
            return text
        kind = "public-ip" if addr.is_global else "private-ip"
        return f"<{kind}-{self._tag(str(addr))}>"

    def host(self, name: str) -> str:
        """Redact one host name or address (IP literals are classified as such)."""
        stripped = name.strip("[]")
        if _RE_TAG.fullmatch(stripped):  # a tag already (a second pass read `https://<host-44a8>/` as a URL
            return stripped  # and tagged the tag: one host had three tags in a report; review r67)
        try:
            ipaddress.ip_address(stripped.split("%", 1)[0])
            return self.ip(stripped)
        except ValueError:
            pass
        if not self.enabled or stripped.lower().rstrip(".") in _LOOPBACK_NAMES:
            return name
        return f"<host-{self._tag(stripped.rstrip('.'))}>"

    def address(self, host: str, port: int | None = None) -> str:
        """`host:port` with the host redacted and the port kept."""
        shown = self.host(host)
        if port is None:
            return shown
        if ":" in shown and not shown.startswith("<"):
            return f"[{shown}]:{port}"
        return f"{shown}:{port}"

    def text(self, text: str) -> str:
        """Redact every address, host name, path and secret found in free text."""
        for secret in self._secrets:
            text = text.replace(secret, "<api-key>")
        text = _RE_URL_CREDS.sub(lambda m: m.group(1), text)
        text = _RE_URL_QUERY.sub(lambda m: m.group(1) + ("?…" if m.group(2) else ""), text)
        if not self.enabled:
            return text
        text = _RE_EMAIL.sub("<email>", text)
        text = _RE_MAC.sub("<mac>", text)
        text = _RE_FILE_URL.sub(lambda m: "<path>" + _tail(m.group(0)), text)
        text = _RE_URL_HOST.sub(lambda m: m.group(1) + self.host(m.group(2)) + (m.group(3) or "")
                                + _url_path(m.group(4) or ""), text)
        text = _RE_PATH.sub(self._path_sub, text)
        text = _RE_BRACKETED_V6.sub(lambda m: "[" + self.ip(m.group(1)) + "]"
                                    if self.ip(m.group(1)) != m.group(1) else m.group(0), text)
        text = _RE_IPV6.sub(lambda m: self.ip(m.group(0)), text)
        text = _RE_IPV4.sub(lambda m: self.ip(m.group(0)), text)
        text = _RE_HOST.sub(lambda m: self.host(m.group(1)), text)
        text = _RE_HOST_PORT.sub(lambda m: self.host(m.group(1)), text)
        for name in self._known_hosts:
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", self.host(name), text,
                          flags=re.IGNORECASE)
        if self._re_user is not None:  # outside the tags made above (a login "beef" is no tag's hex)
            user = self._re_user
            text = "".join(part if i % 2 else user.sub("<user>", part) for i, part in enumerate(_RE_TAG.split(text)))
        return text

    @staticmethod
    def _path_sub(match: re.Match) -> str:
        value = match.group(0)
        tail = _tail(value)
        if value.startswith("\\") or value[1:2] == ":":  # a Windows path (C:\\..., C:/..., \\\\server\\...)
            return "<path>" + tail
        # keep URL paths of our own API and single segments like /p2p-circuit; hide filesystem paths
        if _OWN_API.match(value) or value.count("/") < 2:
            return value
        return "<path>" + tail
