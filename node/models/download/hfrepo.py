"""A Hugging Face repo and quant as a download (2026-12-06): `hf://owner/repo:Q4_K_M`, as llama.cpp's
`-hf owner/repo:Q4_K_M` and Ollama's `hf.co/owner/repo:Q4_K_M` take it.

`read_spec` tells what a download's URL names: a repo to look up (`hf://owner/repo[:QUANT][@revision]`,
`hf.co/owner/repo[:QUANT]`, `huggingface.co/…`, a repo's page pasted from a browser:
`https://huggingface.co/owner/repo[/tree/REV]`), or a file (anything else, unchanged; a file's page,
`https://huggingface.co/owner/repo/blob/REV/path.gguf`, becomes its `hf://` URL). `async_find_file`
lists the repo's files on the Hub (`GET HF_ENDPOINT/api/models/owner/repo/tree/REV?recursive=true`,
pages followed by `Link: rel="next"`, the token as hub.py sends it, 429/5xx asked again after their
Retry-After) and picks its model file as llama.cpp does: the quant matched case-insensitively as a
word of the path (`Q4_K` is not `Q4_K_M`, `Q4_K_M` is not `IQ4_K_M`); no quant: Q4_K_M, else Q8_0,
else the first GGUF. Projectors (mmproj), imatrix and draft files are never the model; a split set
is its part 1 (the set is then fetched whole, sets.py). Several matches, or none, are a 400 naming
what the repo has; the Hub's 404 a NotFound, its 401/403 a HubAccessDenied (gated, private).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import PurePosixPath

import aiohttp

from node import const
from node.errors import DownloadFailed, HubAccessDenied, InvalidRequest, NotFound
from node.logs import kv
from node.models.file_kinds import split_part

from .hub import hf_endpoint, hub_headers, is_hub_url, refusal_hint, retry_after_s
from .urls import cert_failure, describe_error, display_url, http_error

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")  # a Hub user, organisation or repo name
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HUB_HOSTS = {"huggingface.co", "www.huggingface.co", "hf.co"}
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp's, by file name
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's order when no quant is named


@dataclass(frozen=True)
class RepoSpec:
    """A repo to look up on the Hub: owner/repo, the quant asked for (None: the default), a revision."""

    owner: str
    repo: str
    quant: str | None = None
    revision: str | None = None
    folder: str | None = None  # a subfolder's page (`/tree/REV/FOLDER`): the model is looked for there

    @property
    def repo_id(self) -> str:
        return f"{self.owner}/{self.repo}"

    @property
    def label(self) -> str:
        return self.repo_id + (f":{self.quant}" if self.quant else "") + (f"@{self.revision}" if self.revision else "")


def _repo(owner: str, repo: str, revision: str | None, folder: str | None = None) -> RepoSpec:
    """owner/repo[:QUANT] checked (an InvalidRequest saying the accepted forms otherwise)."""
    repo, _, quant = repo.partition(":")
    if revision and ":" in revision and not quant:  # hf://o/r@rev:Q4_K_M, the two swapped
        revision, _, quant = revision.partition(":")
    if not _NAME.match(owner) or not _NAME.match(repo) or (quant and not _QUANT.match(quant)):
        raise InvalidRequest(f"{owner}/{repo}{':' + quant if quant else ''} is not a Hugging Face repo "
                             "(hf://owner/repo[:QUANT], e.g. hf://bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M)",
                             param="url")
    return RepoSpec(owner, repo, None if quant.lower() in ("", "latest") else quant, revision or None, folder or None)


def read_spec(url: str) -> RepoSpec | str:
    """A repo to look up on the Hub, or the URL of the file to download (the given one, or a file's
    Hub page as its hf:// URL). InvalidRequest for a malformed repo."""
    url = url.strip()
    lower = url.lower()
    for prefix in ("hf.co/", "huggingface.co/"):  # Ollama's spelling, no scheme: owner/repo[:QUANT] is a
        if lower.startswith(prefix):  # repo, anything longer a page of the Hub's as a browser shows it
            rest = url[len(prefix):]
            if len([p for p in rest.partition("@")[0].split("/") if p]) == 2:
                url, lower = "hf://" + rest, "hf://" + lower[len(prefix):]
            else:  # (was read as hf://: `huggingface.co/o/r/resolve/main/x.gguf` gave …/resolve/main/resolve/…)
                url, lower = "https://" + url, "https://" + lower
    if lower.startswith("hf://"):
        spec, _, revision = url[len("hf://"):].partition("@")
        parts = [p for p in spec.split("/") if p]
        return _repo(parts[0], parts[1], revision) if len(parts) == 2 else url
    try:
        parsed = urllib.parse.urlsplit(url)
        host = (parsed.hostname or "").lower()
    except ValueError:
        return url  # resolve_url says what is wrong with it
    if parsed.scheme not in ("http", "https") or not (host in _HUB_HOSTS or is_hub_url(url)):
        return url
    seg = [urllib.parse.unquote(p) for p in parsed.path.split("/") if p]
    if len(seg) == 2:
        return _repo(seg[0], seg[1], None)
    if len(seg) >= 4 and seg[2] == "tree":  # the Hub's pages write a revision with `/` as %2F (refs%2Fpr%2F1):
        return _repo(seg[0], seg[1], seg[3], "/".join(seg[4:]))  # what follows it is a folder
    if len(seg) >= 5 and seg[2] == "blob" and seg[-1].lower().endswith(".gguf"):  # a file's page
        return f"hf://{seg[0]}/{seg[1]}/{'/'.join(seg[4:])}@{seg[3]}"
    return url


# --- what the repo has ------------------------------------------------------------------------


def _is_model(path: str) -> bool:
    """A GGUF that can be the model: not a projector, imatrix or draft; a split set by its part 1."""
    name = PurePosixPath(path).name
    if not name.lower().endswith(".gguf") or any(word in name.lower() for word in _NOT_MODELS):
        return False
    part = split_part(PurePosixPath(path))  # type: ignore[arg-type]
    return part is None or part[1] == 1


def _matching(quant: str, models: list[str]) -> list[str]:
    word = re.compile(rf"(?:^|[-._/]){re.escape(quant)}(?=[-./])", re.IGNORECASE)
    return [p for p in models if word.search(p)]


def _shown(paths: list[str]) -> str:
    """A few of the repo's model files, a split set as its part 1 with its count."""
    names = []
    for p in paths[:const.HF_LISTING_NAMES_SHOWN]:
        part = split_part(PurePosixPath(p))  # type: ignore[arg-type]
        names.append(f"{p} ({part[2]} parts)" if part else p)
    more = len(paths) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def pick_file(spec: RepoSpec, paths: list[str]) -> str:
    """The repo path of the model file spec names among the repo's files (InvalidRequest if none or several)."""
    if spec.folder:
        paths = [p for p in paths if p.startswith(spec.folder.rstrip("/") + "/")]
    models = sorted(p for p in paths if _is_model(p))
    if not models:
        ggufs = [p for p in paths if p.lower().endswith(".gguf")]
        has = f" (only {_shown(ggufs)})" if ggufs else " (no .gguf file at all: look for a -GGUF repo of it)"
        raise InvalidRequest(f"Hugging Face repo {spec.repo_id} has no GGUF model file{has}", param="url")
    for quant in [spec.quant] if spec.quant else DEFAULT_QUANTS:
        found = _matching(quant, models)
        if len(found) > 1:
            raise InvalidRequest(f"{quant} matches {len(found)} files in {spec.repo_id}: {_shown(found)}; name one "
                                 f"as hf://{spec.repo_id}/{found[0]}", param="url")
        if found:
            return found[0]
    if spec.quant:
        raise InvalidRequest(f"Hugging Face repo {spec.repo_id} has no {spec.quant} file; it has {_shown(models)}",
                             param="url")
    return models[0]  # neither default quant: the first GGUF, as llama.cpp


# --- the Hub's listing ------------------------------------------------------------------------


def _refused(spec: RepoSpec, url: str, status: int, code: str, sent_token: bool) -> Exception:
    """The Hub's 401/403/404 on a listing said as what it means."""
    if status == 404 or code in ("RepoNotFound", "RevisionNotFound"):  # the Hub says 401 to a stranger
        if code == "RevisionNotFound":
            return NotFound(f"Hugging Face repo {spec.repo_id} has no revision {spec.revision or 'main'}")
        private = ", or the token (HF_TOKEN or huggingface-cli login) has no access to it" if sent_token else \
            "; if it is private, set HF_TOKEN to a Hugging Face token with access (or run `huggingface-cli login`)"
        return NotFound(f"Hugging Face has no repo {spec.repo_id} ({http_error(status)}){private}")
    return HubAccessDenied(f"Hugging Face refused to list the files of {spec.repo_id}: {http_error(status)}"
                           + refusal_hint(url, status, sent_token))


async def _async_page(session: aiohttp.ClientSession, spec: RepoSpec, url: str,
                      headers: dict[str, str]) -> tuple[list, str | None]:
    """One page of the listing (asked again on a 429/5xx or a dropped connection): its entries and
    the next page's URL."""
    for attempt in range(1, const.HF_LISTING_ATTEMPTS + 1):
        wait = min(2.0 ** (attempt - 1) * const.DOWNLOAD_RETRY_BASE_S, const.HF_LISTING_RETRY_AFTER_MAX_S)
        try:
            async with session.get(url, headers=headers) as resp:
                if resp.status in (401, 403, 404):
                    raise _refused(spec, url, resp.status, resp.headers.get("X-Error-Code", ""),
                                   "Authorization" in headers)
                if resp.status == 200:
                    entries = json.loads(await resp.read())
                    if not isinstance(entries, list):
                        raise DownloadFailed(f"Hugging Face's listing of {spec.repo_id} is not a list of files "
                                             f"({display_url(url)}): is HF_ENDPOINT a Hugging Face Hub?")
                    nxt = resp.links.get("next", {}).get("url")
                    return entries, str(nxt) if nxt else None
                error = http_error(resp.status)
                if resp.status != 429 and resp.status < 500:
                    raise DownloadFailed(f"Hugging Face answered {error} to the listing of {spec.repo_id}")
                asked = retry_after_s(resp.headers)
                wait = min(max(wait, asked or 0.0), const.HF_LISTING_RETRY_AFTER_MAX_S)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            if (bad_cert := cert_failure(exc, url)) is not None:  # not asked again: it will not fix itself
                raise DownloadFailed(f"cannot list the files of {spec.repo_id} on Hugging Face: {bad_cert}") from exc
            error = describe_error(exc)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DownloadFailed(f"Hugging Face's listing of {spec.repo_id} is not JSON ({display_url(url)}): "
                                 "is HF_ENDPOINT a Hugging Face Hub?") from exc
        if attempt == const.HF_LISTING_ATTEMPTS:
            break
        log.info("DIAG: Hugging Face listing asked again %s", kv(repo=spec.repo_id, attempt=attempt,
                                                                 retry_in_s=round(wait, 2), error=error))
        await asyncio.sleep(wait)
    raise DownloadFailed(f"cannot list the files of {spec.repo_id} on Hugging Face ({display_url(url)}) after "
                         f"{const.HF_LISTING_ATTEMPTS} tries; last: {error}")


async def async_list_files(spec: RepoSpec) -> list[str]:
    """Every file path of the repo at its revision (main by default), from the Hub's tree listing."""
    q = urllib.parse.quote
    url = (f"{hf_endpoint()}/api/models/{q(spec.owner)}/{q(spec.repo)}/tree/"
           f"{q(spec.revision or 'main', safe='')}?recursive=true")
    token = await asyncio.get_running_loop().run_in_executor(None, hub_headers, url)  # may read a file
    paths: list[str] = []
    timeout = aiohttp.ClientTimeout(total=const.HF_LISTING_TIMEOUT_S, connect=const.DOWNLOAD_CONNECT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        next_url: str | None = url
        for _page in range(const.HF_LISTING_PAGES_MAX):
            if next_url is None:
                break
            entries, next_url = await _async_page(session, spec, next_url,
                                                  token if is_hub_url(next_url) else {})  # the token: Hub only
            paths += [e["path"] for e in entries
                      if isinstance(e, dict) and e.get("type") == "file" and isinstance(e.get("path"), str)]
    return paths


async def async_find_file(spec: RepoSpec) -> str:
    """`hf://owner/repo/path.gguf[@revision]` of the model file spec names, looked up on the Hub."""
    paths = await async_list_files(spec)
    path = pick_file(spec, paths)
    log.info("DIAG: Hugging Face repo resolved %s", kv(repo=spec.repo_id, quant=spec.quant or "default",
                                                       revision=spec.revision, file=path, files=len(paths)))
    return f"hf://{spec.repo_id}/{path}" + (f"@{spec.revision}" if spec.revision else "")
