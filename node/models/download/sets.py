"""A split model's parts as one download (2026-12-06).

Hugging Face ships big models split by gguf-split (`big-00001-of-00003.gguf` …), and llama.cpp loads
such a model only with all its parts beside part 1. A download of any part's URL (or name) is the
whole set: every part's URL is the named one with its part number replaced, each lands in
`models/` under llama.cpp's spelling (`llama_split_name`), part 1's name is the set's (one active
download per set; the models folder's watch lists part 1 only). `async_plan` asks the origin for
each part's size first (`HEAD`, redirects not followed: the Hub's resolve answer carries
`X-Linked-Size`), so a missing part fails before gigabytes are fetched and the free disk space is
checked against the whole set. The named part's URL is kept as the user spelt it (`--sha256` is its
file's). A URL with a query string of its own (an S3 presigned URL: one object's signature) fetches
the named part alone, its job's `note` naming the parts still missing, each needing its own URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from node.errors import DownloadFailed, InvalidRequest
from node.models.file_kinds import SPLIT_RE, llama_split_name, split_part

from .hub import hub_headers
from .job import DownloadJob
from .partfile import size_or_zero
from .urls import cert_failure, display_url, http_error


@dataclass
class PartSet:
    """What a download URL fetches: `parts` [(URL, file name in models/)], part 1 first; `named`, the
    index of the part the URL named (the user's URL verbatim: `--sha256` is its file's); `others`, a
    split part fetched alone (a per-object signed URL): the set's other parts [(URL without the query,
    file name)], part 1 first, which each need their own URL."""

    parts: list[tuple[str, str]]
    named: int = 0
    others: list[tuple[str, str]] = field(default_factory=list)


def signed_per_object(url: str) -> bool:
    """A query string other than the Hub's own `?download=true`: an S3 presigned URL and the like sign
    one object, so the query cannot be carried over to another part's URL (it answers 403 there)."""
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True)
    return bool(query) and query != [("download", "true")]


def set_parts(url: str, file_name: str, given_name: str | None) -> PartSet:
    """Every part of the split set `url` names (any part); just (url, file_name) for a file that is
    not a split part; the named part alone (and the others listed) for a per-object signed URL."""
    parsed = urllib.parse.urlsplit(url)
    head, _, segment = parsed.path.rpartition("/")
    m = SPLIT_RE.match(urllib.parse.unquote(segment))
    named = split_part(Path(urllib.parse.unquote(segment)))
    if m is None or named is None:
        return PartSet([(url, file_name)])
    count = named[2]
    local = split_part(Path(file_name))
    if given_name is not None and (local is None or local[2] != count):
        raise InvalidRequest(f"{urllib.parse.unquote(segment)} is part {named[1]} of a model split in {count} "
                             f"parts, downloaded as the whole set: a filename for it must be a part's name too "
                             f"(name-00001-of-{count:05d}.gguf)", param="filename")
    prefix = local[0] if local is not None else named[0]
    plain = urllib.parse.unquote(segment)
    out = []
    for no in range(1, count + 1):
        remote = plain[:m.start("no")] + f"{no:05d}" + plain[m.end("no"):]  # the origin's own spelling
        path = f"{head}/{urllib.parse.quote(remote)}"
        part_url = url if no == named[1] else urllib.parse.urlunsplit(parsed._replace(path=path))
        out.append((part_url, llama_split_name(prefix, no, count)))
    i = named[1] - 1
    if signed_per_object(url):
        return PartSet([out[i]], 0, [(display_url(u), n) for u, n in out[:i] + out[i + 1:]])
    return PartSet(out, i)


def alone_note(name: str, count: int, missing: list[str]) -> str:
    """What a split part fetched alone leaves to do (the job's `note`): the parts still missing."""
    return (f"{name} is one part of a model split in {count} parts; its URL is signed for "
            f"that one file (a query string), so the other parts were not fetched with it: "
            f"{', '.join(missing)} still missing — download each with its own URL")


async def async_plan(session: aiohttp.ClientSession, job: DownloadJob, parts: list[Path],
                     io: concurrent.futures.Executor, models_dir: Path) -> None:
    """Each part's size from the origin (`part_bytes`), the set's total, and the free disk space
    against what is still to fetch; DownloadFailed naming a part the origin does not have. A part
    whose size cannot be learnt (no HEAD, no size, a busy server) is learnt when it is fetched."""
    loop = asyncio.get_running_loop()
    n = len(job.parts)
    for i, (url, name) in enumerate(job.parts):
        headers = {"Accept-Encoding": "identity", **await loop.run_in_executor(io, hub_headers, url)}
        try:
            async with session.head(url, headers=headers, allow_redirects=False) as resp:
                if resp.status in (404, 410):
                    raise DownloadFailed(f"part {i + 1} of {n} ({name}): {http_error(resp.status)} from "
                                         f"{display_url(url)}: the origin does not have this part of the set")
                size = resp.headers.get("X-Linked-Size") if 300 <= resp.status < 400 else \
                    resp.headers.get("Content-Length") if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            if (bad_cert := cert_failure(exc, url)) is not None:  # not asked again for every part, then fetched
                raise DownloadFailed(f"part {i + 1} of {n} ({name}): {bad_cert}") from exc
            size = None  # the fetch itself will say what is wrong
        job.part_bytes[i] = int(size) if size and size.isdigit() else None
    if all(b is not None for b in job.part_bytes):
        job.total_bytes = sum(b for b in job.part_bytes if b is not None)
        have = 0
        for part in parts:
            have += await loop.run_in_executor(io, size_or_zero, part)
        free = (await loop.run_in_executor(io, shutil.disk_usage, models_dir)).free
        if job.total_bytes - have > free:
            raise DownloadFailed(f"not enough disk space: {(job.total_bytes - have) / 1e6:.0f} MB to download "
                                 f"({n} parts), {free / 1e6:.0f} MB free in {models_dir}")
