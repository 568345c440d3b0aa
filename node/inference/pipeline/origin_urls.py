"""The origin of a model given by URL (`--model URL`, config.toml's `models`), as PartialModels opens
it (2026-12-06): a file's URL is its origin as given; a Hugging Face repo (`hf://owner/repo[:QUANT]`,
`hf.co/owner/repo:QUANT`, a repo's page pasted from a browser; what `swarmllm download` takes,
node/models/download/hfrepo.py) is looked up on the Hub once, off the loop, and the file URL found
(`hf://owner/repo/path.gguf[@rev]`) is the origin the partial model keeps and advertises. A repo's
quant that is a split set is refused: a split model is served whole only (file_kinds.refuse_slices)."""

from __future__ import annotations

import logging
from pathlib import PurePosixPath

from node.errors import InvalidRequest, SplitModelServedWhole
from node.logs import kv
from node.models.download.hfrepo import RepoSpec, async_find_file, read_spec
from node.models.download.urls import display_url, resolve_url
from node.models.file_kinds import split_part

log = logging.getLogger(__name__)


class OriginUrls:
    """URL as given -> the file URL of its origin (a repo's looked up once, then remembered)."""

    def __init__(self) -> None:
        self._files: dict[str, str] = {}  # a repo as given -> the file found in it

    def file_of(self, url: str) -> str | None:
        """The file URL `url` names, None for a repo not looked up yet (InvalidRequest: a malformed repo)."""
        if url in self._files:
            return self._files[url]
        target = read_spec(url)
        return None if isinstance(target, RepoSpec) else target

    async def async_file_of(self, url: str) -> str:
        """The file URL `url` names, a repo looked up on the Hub (DownloadFailed, NotFound,
        HubAccessDenied, InvalidRequest as `swarmllm download` says them; SplitModelServedWhole)."""
        known = self.file_of(url)
        if known is not None:
            return known
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
        self._files[url] = found
        return found

    def shown(self, url: str) -> str:
        """The URL as logs and the GUI show it: the origin without its query, a repo not looked up as hf://…"""
        try:
            file = self.file_of(url)
            return display_url(resolve_url(file)) if file is not None else f"hf://{read_spec(url).label}"  # type: ignore[union-attr]
        except (InvalidRequest, ValueError):  # a malformed URL: its open says what is wrong with it
            return url.partition("?")[0]
