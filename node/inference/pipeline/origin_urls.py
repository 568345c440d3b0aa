"""The origin of a model given by URL (`--model URL`, config.toml's `models`), as PartialModels opens
it (2026-12-06): a file's URL is its origin as given; a Hugging Face repo (`hf://owner/repo[:QUANT]`,
`hf.co/owner/repo:QUANT`, a repo's page pasted from a browser; what `swarmllm download` takes,
node/models/download/hfrepo.py) is looked up on the Hub once, off the loop, and the file URL found
(`hf://owner/repo/path.gguf[@rev]`) is the origin the partial model keeps and advertises. A repo's
quant that is a split set is refused: a split model is served whole only (file_kinds.refuse_slices).

The files found are remembered in models/repo-files.json (written off the loop, atomically): a start
that finds a repo there opens the file's partial model at once, offline too (the layers held are
served, as for a file URL), and the Hub is asked again in the background (`async_refresh`): a repo
whose quant is now another file is remembered as that file, served from the next start on."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from node.errors import InvalidRequest, SplitModelServedWhole
from node.logs import kv
from node.models.download.hfrepo import RepoSpec, async_find_file, read_spec
from node.models.download.urls import display_url, resolve_url
from node.models.file_kinds import split_part
from node.models.header import write_atomic

log = logging.getLogger(__name__)

REPO_FILES = "repo-files.json"  # in models/: {"repos": {repo key: hf:// URL of the file found}}


def _key(spec: RepoSpec) -> str:
    """A repo and quant however spelt (hf://, hf.co/, its page; the quant in any case): one key."""
    return f"{spec.repo_id}:{(spec.quant or '').upper()}@{spec.revision or ''}/{spec.folder or ''}"


def _read(path: Path) -> dict[str, str]:
    """The repos remembered (blocking); none when the file is missing or unreadable (said)."""
    try:
        repos = json.loads(path.read_text())["repos"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("DIAG: remembered repo files unreadable, looked up again %s", kv(file=str(path), error=str(exc)))
        return {}
    return {k: v for k, v in repos.items() if isinstance(k, str) and isinstance(v, str) and v.startswith("hf://")} \
        if isinstance(repos, dict) else {}


class OriginUrls:
    """URL as given -> the file URL of its origin (a repo's looked up once, then remembered, on disk too)."""

    def __init__(self, models_dir: Path | None = None) -> None:
        self._path = models_dir / REPO_FILES if models_dir is not None else None
        self._files: dict[str, str] = {}  # a repo's key -> the file found in it
        self._looked_up: set[str] = set()  # the keys looked up on the Hub by this run
        self._loaded = False
        self._write_lock = asyncio.Lock()

    async def async_load(self) -> None:
        """The repos an earlier run looked up (once, off the loop): `file_of` knows them from then on."""
        if not self._loaded and self._path is not None:
            remembered = await asyncio.get_running_loop().run_in_executor(None, _read, self._path)
            self._files = {**remembered, **self._files}
        self._loaded = True

    def file_of(self, url: str) -> str | None:
        """The file URL `url` names, None for a repo not looked up yet (InvalidRequest: a malformed repo)."""
        target = read_spec(url)
        return self._files.get(_key(target)) if isinstance(target, RepoSpec) else target

    def remembered(self, url: str) -> bool:
        """Whether url is a repo whose file was known from an earlier run, not looked up by this one."""
        spec = read_spec(url)
        return isinstance(spec, RepoSpec) and _key(spec) in self._files and _key(spec) not in self._looked_up

    async def async_file_of(self, url: str, held: Callable[[str], bool] | None = None) -> str:
        """The file URL `url` names, a repo looked up on the Hub (DownloadFailed, NotFound,
        HubAccessDenied, InvalidRequest as `swarmllm download` says them; SplitModelServedWhole).
        `held(file URL)` (blocking, run off the loop): whether that file's partial model is on disk;
        a file remembered from an earlier run whose folder is gone is looked up again (found in
        review: a quant renamed on the Hub, the folder deleted, made every `--layers` start a 404)."""
        await self.async_load()
        known = self.file_of(url)
        if known is not None and held is not None and self.remembered(url):
            if not await asyncio.get_running_loop().run_in_executor(None, held, known):
                known = None
        if known is not None:
            return known
        return await self._async_look_up(url)

    async def async_refresh(self, url: str) -> None:
        """A repo whose file an earlier run found, asked of the Hub again (in the background, once):
        another file now is remembered and served from the next start on; a failure is said only."""
        if not self.remembered(url):
            return
        was, label = self.file_of(url), read_spec(url).label  # type: ignore[union-attr]
        try:
            found = await self._async_look_up(url)
        except Exception as exc:  # noqa: BLE001 - offline, a 503: the file remembered stays (the next start asks again)
            log.info("DIAG: Hugging Face repo not looked up again, its remembered file served %s",
                     kv(repo=label, file=was, error=getattr(exc, "message", str(exc))))
            return
        if found != was:
            log.warning("DIAG: Hugging Face repo names another file now, served from the next start %s",
                        kv(repo=label, file=found, serving=was))

    async def _async_look_up(self, url: str) -> str:
        spec = read_spec(url)
        assert isinstance(spec, RepoSpec)
        found = await async_find_file(spec)
        part = split_part(PurePosixPath(found.partition("@")[0]))  # type: ignore[arg-type]
        if part is not None:
            raise SplitModelServedWhole(
                f"{spec.label} is a split model ({part[2]} parts, {found.rsplit('/', 1)[-1].partition('@')[0]}): a "
                "split model is served whole on this node only, not as layers (--model URL with --layers or "
                f"--serve auto); `swarmllm download {url}` fetches it whole to serve it whole, or merge its parts "
                "into one file (llama-gguf-split --merge) to serve layers of it", param="model")
        log.info("DIAG: model URL is a Hugging Face repo, its file is the origin %s", kv(repo=spec.label, file=found))
        self._looked_up.add(_key(spec))
        if self._files.get(_key(spec)) != found:
            self._files[_key(spec)] = found
            await self._async_save()
        return found

    async def _async_save(self) -> None:
        """The repos' files on disk (off the loop, whole or not at all); a failure is said only."""
        if self._path is None:
            return
        async with self._write_lock:
            data = json.dumps({"repos": dict(sorted(self._files.items()))}, indent=1).encode()
            try:
                await asyncio.get_running_loop().run_in_executor(None, write_atomic, self._path, data)
            except OSError as exc:
                log.warning("DIAG: repo files not remembered %s", kv(file=str(self._path), error=str(exc)))

    def shown(self, url: str) -> str:
        """The URL as logs and the GUI show it: the origin without its query, a repo not looked up as hf://…"""
        try:
            file = self.file_of(url)
            return display_url(resolve_url(file)) if file is not None else f"hf://{read_spec(url).label}"  # type: ignore[union-attr]
        except (InvalidRequest, ValueError):  # a malformed URL: its open says what is wrong with it
            return url.partition("?")[0]
