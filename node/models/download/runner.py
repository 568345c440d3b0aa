"""Model downloads: a GGUF from a URL (or `hf://owner/repo/file.gguf`) into `data_dir/models/`.

A download streams into `<name>.gguf.part` and resumes it with a `Range` request after a dropped
connection (DOWNLOAD_RETRIES attempts, backing off); a server that ignores `Range` restarts it from
zero. It checks the free disk space against the announced size before it starts, the GGUF magic in
the first bytes (a login page or an error page is refused at once, not after gigabytes), the size at
the end, and the sha256 when one was given. Only then is the file renamed into `models/`, scanned
into the catalog and registered, so it shows up in /api/admin/models and the GUI and can be loaded.
Writes, hashing and renames run in an executor (the loop never blocks); progress is published to
observers at most DOWNLOAD_PROGRESS_S apart. URLs are logged without their query string (signed
URLs carry credentials there). Any part of a split model (`big-00002-of-00003.gguf`) downloads the
whole set, part after part, each resumed and checked as one file; the parts land in `models/`
together once every one is checked (sets.py); a part's per-object signed URL fetches that part alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from node import const
from node.errors import Conflict, DownloadFailed, InvalidRequest, NodeError, NotFound, ShuttingDown
from node.logs import kv
from node.models.file_kinds import split_part
from node.observe import Observers

from .fetch import Retryable, async_fetch, retry_delay
from .hfrepo import RepoSpec, async_find_file, read_spec
from .job import DownloadJob
from .partfile import cut_landing, discard_part, land, reclaim_cut_landing, size_and_sha256, size_or_zero
from .restore import find_kept, finish_linked_landings, remove_stale_sidecars, restored_jobs
from .sets import alone_note, async_plan, set_parts
from .urls import cert_failure, describe_error, display_url, file_name_for, resolve_url

log = logging.getLogger(__name__)

DownloadObserver = Callable[[DownloadJob], None]


async def _async_to_the_end(work: asyncio.Future[None]) -> None:
    """Await an executor job to its end even when the task is cancelled meanwhile (the cancel is
    raised once it is done)."""
    cancelled = False
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            cancelled = True
    work.result()
    if cancelled:
        raise asyncio.CancelledError


class ModelDownloader:
    """Runs downloads into `models_dir`; `on_file(path, sha256, origin_url, url)` adds a finished file
    to the node and returns its model id (origin_url: where it came from, without the query string;
    url: the finishing job's own whole URL, query included, in memory only, for the public-origin
    check; sha256: None when the catalog must hash it)."""

    def __init__(self, models_dir: Path, on_file: Callable[[Path, str | None, str, str], Awaitable[str]]):
        self.models_dir = models_dir
        self.on_file = on_file
        self.jobs: dict[str, DownloadJob] = {}
        self._closed = False  # async_close ran: a Hub lookup ending after it starts nothing (found in review)
        self._observers: Observers[[DownloadJob]] = Observers("download")

    def subscribe(self, observer: DownloadObserver) -> Callable[[], None]:
        """Call observer(job) on every state change and progress step; returns an unsubscribe."""
        return self._observers.subscribe(observer)

    async def async_start(self, url: str, *, sha256: str | None = None, file_name: str | None = None) -> DownloadJob:
        """start(), after a Hugging Face repo (`hf://owner/repo[:QUANT]`, `hf.co/…`, a repo's page) is
        looked up on the Hub for its model file (hfrepo.py)."""
        target = read_spec(url)
        if isinstance(target, RepoSpec):
            target = await async_find_file(target)
        return self.start(target, sha256=sha256, file_name=file_name)

    def start(self, url: str, *, sha256: str | None = None, file_name: str | None = None) -> DownloadJob:
        """Start a download of a file's URL (loop); the same file already downloading is that job, not
        a second. A repo (no file named) needs the Hub: async_start."""
        if self._closed:
            raise ShuttingDown("the node is stopping: the download was not started")
        target = read_spec(url)
        if isinstance(target, RepoSpec):
            raise InvalidRequest(f"{target.label} names a repo, not a file: it is looked up on the Hub by "
                                 "async_start", param="url")
        resolved = resolve_url(target)
        plan = set_parts(resolved, file_name_for(resolved, file_name), file_name)
        parts = plan.parts
        name = parts[0][1]  # a split set's: its part 1's
        if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
            raise InvalidRequest("sha256 must be 64 hex digits", param="sha256")
        for job in self.jobs.values():
            if job.file_name.lower() == name.lower() and job.active:  # one .part per name on any filesystem
                if job.parts[0][0] != parts[0][0]:
                    raise Conflict(f"{name} is already being downloaded from another URL")
                if sha256 is not None and sha256.lower() != job.sha256:  # joined, the hash asked went unchecked
                    raise Conflict(f"{name} is already being downloaded " + (
                        f"checked against another sha256 ({job.sha256})" if job.sha256 else "without a sha256 check") +
                        ": wait for it to end, or cancel it and download it again with this sha256")
                return job
        for job in self.jobs.values():  # a part of a set fetched alone and the whole set: the same .part
            shared = {n.lower() for _u, n in job.parts} & {n.lower() for _u, n in parts} if job.active else set()
            if shared:
                raise Conflict(f"{min(shared)} is already being downloaded (as part of {job.file_name})")
        for job in self.jobs.values():  # a paused one's bytes of another file: never truncated by this one
            kept = {n.lower(): display_url(u) for u, n in job.parts} if job.resumable else {}
            other = next((n for u, n in parts if kept.get(n.lower(), display_url(u)) != display_url(u)), None)
            if other is not None:
                raise Conflict(f"a {job.state} download of {other} from {kept[other.lower()]} keeps its partial file "
                               f"under that name: resume it, cancel it (which deletes it) or choose another filename")
        set_landed = len(parts) > 1 and (self.models_dir / name).exists()  # part 1 lands last
        for _url, part_name in parts:
            target = self.models_dir / part_name
            if len(parts) > 1 and not set_landed and cut_landing(target.with_name(part_name + ".part"), target):
                continue  # an earlier run died landing this set: the download takes the part back
            if target.exists():
                raise Conflict(f"models/{part_name} already exists; remove it first or choose another filename")
        job = DownloadJob(hashlib.sha256(f"{resolved}\0{time.time_ns()}".encode()).hexdigest()[:12], resolved, name,
                          sha256.lower() if sha256 else None, parts=parts, named=plan.named, others=plan.others)
        self.jobs[job.id] = job
        self._supersede(job)
        job.task = asyncio.get_running_loop().create_task(self._async_run(job), name=f"download-{job.id}")
        job.task.add_done_callback(lambda _task: self._settle(job))
        self._forget_finished()
        return job

    def _supersede(self, job: DownloadJob) -> None:
        """Every other resumable job of the new one's file names goes on as it (2026-12-06: a restored or
        failed job stayed listed resumable, Resume answered 409, and its Cancel deleted the `.part` of a
        newer download of that file paused meanwhile): no longer resumable, its Cancel deletes nothing."""
        names = {n.lower() for _u, n in job.parts}
        for other in self.jobs.values():
            if other is not job and other.resumable and names & {n.lower() for _u, n in other.parts}:
                other.resumed_as = job.id
                log.info("DIAG: model download superseded %s", kv(download=other.id, by=job.id, file=other.file_name))
                self._observers.emit(other)

    def _forget_finished(self) -> None:
        """At most DOWNLOADS_FINISHED_KEPT finished downloads (done, failed, cancelled, resumed as
        another) stay listed, the oldest forgotten first; running and resumable (paused) ones stay."""
        finished = [j for j in self.jobs.values() if not j.active and not j.resumable]
        for job in finished[:max(0, len(finished) - const.DOWNLOADS_FINISHED_KEPT)]:
            del self.jobs[job.id]

    def all(self) -> list[DownloadJob]:
        """This run's downloads, oldest first: the running and paused ones, and the last
        DOWNLOADS_FINISHED_KEPT finished."""
        return list(self.jobs.values())

    def get(self, job_id: str) -> DownloadJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no download {job_id}")
        return job

    def cancel(self, job_id: str) -> DownloadJob:
        job = self.get(job_id)
        if job.active and job.task is not None and not job.landing:  # landing: too late, it ends done
            job.user_cancelled = True
            job.task.cancel()
        return job

    def pause(self, job_id: str) -> DownloadJob:
        """Stop a download, keeping its partial file (state "paused"; resume() goes on with Range)."""
        job = self.get(job_id)
        if job.active and job.task is not None and not job.landing:
            job.user_paused = True
            job.task.cancel()
        return job

    async def async_restore(self) -> list[DownloadJob]:
        """At start: the downloads an earlier run left in models/ (`.part` + sidecar) as paused jobs
        (restore.py); a `.part` without a sidecar, which cannot be resumed, is said in the log."""
        loop = asyncio.get_running_loop()
        for name in await loop.run_in_executor(None, finish_linked_landings, self.models_dir):
            log.info("DIAG: model download landing an earlier run did not finish put right %s", kv(file=name))
        # (2026-12-07: one a crash left between a download's rename and its delete stayed in models/ for good)
        for name in await loop.run_in_executor(None, remove_stale_sidecars, self.models_dir):
            log.info("DIAG: model download sidecar of a download that ended removed %s", kv(file=name))
        kept, orphans = await loop.run_in_executor(None, find_kept, self.models_dir)
        for name, size, why in orphans:
            log.info("DIAG: model download partial file cannot be resumed (%s) %s", why, kv(
                file=name, mb=round(size / 1e6, 1), dir=self.models_dir))
        jobs = [job for job in restored_jobs(kept, set(self.jobs))
                if not any(j.file_name.lower() == job.file_name.lower() for j in self.jobs.values())]
        for job in jobs:
            self.jobs[job.id] = job
            log.info("DIAG: model download kept from an earlier run, paused %s", kv(
                download=job.id, file=job.file_name, url=display_url(job.url), done_bytes=job.done_bytes,
                parts=len(job.parts) if len(job.parts) > 1 else None))
            self._observers.emit(job)
        return jobs

    def resume(self, job_id: str) -> DownloadJob:
        """A new download of a paused one's URL and file (or a failed one's whose partial file is
        kept), which resumes from its partial file."""
        job = self.get(job_id)
        if not job.resumable:
            raise Conflict(f"download {job_id} is {job.state}, not paused" if job.state != "failed" else
                           f"download {job_id} failed and kept no partial file: start it again")
        resumed = self.start(job.url, sha256=job.sha256, file_name=job.file_name)
        if job.restored:  # its URL is the sidecar's, without a query: a refusal says to paste the link
            resumed.restored, resumed.signed = True, resumed.signed or job.signed
        job.resumed_as = resumed.id
        return resumed

    async def async_discard(self, job_id: str) -> DownloadJob:
        """Cancel a paused download (or a failed one's kept partial file): its partial file is removed."""
        job = self.get(job_id)
        going = next((j for j in self.jobs.values() if j.active and j.file_name.lower() == job.file_name.lower()),
                     None)  # (the same name test as start()'s)
        if going is not None and job.state in ("paused", "failed"):  # that download writes the partial file now
            raise Conflict(f"download {job_id} was resumed as {going.id}; cancel that one")
        if job.resumed_as is not None:
            raise Conflict(f"download {job_id} was resumed as {job.resumed_as}; cancel that one")
        if not job.resumable:
            raise Conflict(f"download {job_id} is {job.state}, not paused")
        was = job.state
        job.state, job.error, job.kept_bytes = "cancelled", "cancelled", 0  # first: a resume now is refused
        for _url, name in job.parts:
            await asyncio.get_running_loop().run_in_executor(None, discard_part, self.models_dir / (name + ".part"))
        log.info("DIAG: model download cancelled %s", kv(download=job.id, done_bytes=job.done_bytes, was=was))
        self._observers.emit(job)
        return job

    async def async_close(self) -> None:
        """Cancel running downloads (their .part files stay, so a new download of the same file resumes)."""
        self._closed = True
        tasks = [job.task for job in self.jobs.values() if job.task is not None and not job.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one download -------------------------------------------------------------------------

    async def _async_run(self, job: DownloadJob) -> None:
        loop = asyncio.get_running_loop()
        parts = [self.models_dir / (name + ".part") for _url, name in job.parts]
        started = time.monotonic()
        # one thread for this download's file operations: they happen in order, and a write still
        # running when the task is cancelled finishes before the file is closed
        io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"download-{job.id}")
        log.info("DIAG: model download started %s", kv(download=job.id, url=display_url(job.url), file=job.file_name,
                                                        parts=len(parts) if len(parts) > 1 else None))
        try:
            await loop.run_in_executor(io, lambda: self.models_dir.mkdir(parents=True, exist_ok=True))
            if len(parts) > 1:
                moved = await loop.run_in_executor(io, reclaim_cut_landing, parts,
                                                   [self.models_dir / name for _url, name in job.parts])
                if moved:
                    log.info("DIAG: model download resumes a landing an earlier run did not finish %s", kv(
                        download=job.id, parts=",".join(p.name for p in moved)))
            timeout = aiohttp.ClientTimeout(total=None, connect=const.DOWNLOAD_CONNECT_TIMEOUT_S,
                                            sock_read=const.DOWNLOAD_READ_TIMEOUT_S)
            logged = [time.monotonic()]

            def progress(job: DownloadJob) -> None:
                self._observers.emit(job)
                now = time.monotonic()
                if job.state == "downloading" and now - logged[0] >= const.DOWNLOAD_LOG_S:
                    logged[0] = now  # node.log says how it goes, not only "started" and "complete"
                    log.info("DIAG: model download progress %s", kv(
                        download=job.id, done_mb=round(job.done_bytes / 1e6, 1),
                        total_mb=round(job.total_bytes / 1e6, 1) if job.total_bytes else None,
                        part=job.part if len(job.parts) > 1 else None,
                        mb_per_s=round(job.fetched_bytes / 1e6 / max(now - started, 1e-6), 2)))

            digests: list[str] = []
            size = 0
            async with aiohttp.ClientSession(timeout=timeout) as session:
                if len(parts) > 1:
                    await async_plan(session, job, parts, io, self.models_dir)
                for i, part in enumerate(parts):
                    job.part = i + 1
                    got, digest = await self._async_part(session, job, i, part, io, progress, size)
                    size += got
                    digests.append(digest)
            # every part checked: into models/ as one executor job that a pause, cancel or shutdown
            # does not cut short (some parts landed, others still .part, was refused "already exists")
            job.landing = True
            try:
                await _async_to_the_end(loop.run_in_executor(
                    io, land, parts, [self.models_dir / name for _url, name in job.parts]))
            except FileExistsError as exc:  # (copied there by hand while it downloaded: never overwritten)
                name = Path(exc.filename).name if exc.filename else job.file_name
                raise DownloadFailed(f"models/{name} appeared while the download ran and is not overwritten; "
                                     f"the download is kept as {name}.part: move models/{name} away and "
                                     "resume it, or cancel it") from None
            if job.others:
                await self._async_alone(job, digests[0], io)
            else:
                job.model_id = await self.on_file(self.models_dir / job.file_name, digests[0],
                                                  display_url(job.parts[0][0]), job.parts[0][0])
            job.state = "done"
            job.finished_at = time.time()
            elapsed = time.monotonic() - started
            log.info("DIAG: model download complete %s", kv(
                download=job.id, model=job.model_id, bytes=size, elapsed_s=round(elapsed, 1),
                parts=len(parts) if len(parts) > 1 else None,
                mb_per_s=round(job.fetched_bytes / 1e6 / max(elapsed, 1e-6), 2), sha256=digests[0][:16]))
        except asyncio.CancelledError:
            job.stop.set()  # a hash in progress stops
            try:
                if job.user_cancelled:  # the user said no: nothing of it stays (at shutdown the .part
                    for part in parts:  # files stay: the same download resumes)
                        await loop.run_in_executor(io, discard_part, part)
            finally:  # "cancelled" only once the files are gone: a client polling the job can rely on it
                how = "paused" if job.user_paused and not job.user_cancelled else "cancelled"
                job.state, job.error, job.finished_at = how, how, time.time()
                log.info("DIAG: model download %s %s", how, kv(download=job.id, done_bytes=job.done_bytes))
            raise
        except NodeError as exc:
            self._fail(job, exc.message + self._paste_again(job, exc))
        except aiohttp.ClientError as exc:  # redirects, bad URLs: their text may hold a signed URL
            self._fail(job, f"{type(exc).__name__} fetching {display_url(job.url)}")
        except OSError as exc:  # disk full, permissions (a part's own are DownloadFailed: _async_part)
            self._fail(job, await self._async_disk_error(exc, None, io))
        except Exception as exc:  # a bug must end in a failed job, never a stuck one
            log.error("model download %s failed unexpectedly: %s", job.id, type(exc).__name__)
            self._fail(job, f"internal error: {type(exc).__name__}")
        finally:
            if job.state == "failed":  # what stays on disk: Resume goes on from it
                job.kept_bytes = 0
                try:
                    for part in parts:
                        job.kept_bytes += await loop.run_in_executor(io, size_or_zero, part)
                except OSError:
                    pass
            io.shutdown(wait=False)
            self._observers.emit(job)

    @staticmethod
    def _paste_again(job: DownloadJob, exc: NodeError) -> str:
        """What to do when the origin refuses a download restored from disk: its URL is the sidecar's,
        without the query string a signed link needs (never kept on disk)."""
        if not job.restored or not isinstance(exc, DownloadFailed) or exc.origin_status not in (401, 403, 410):
            return ""
        why = "its link was signed (a query string, never kept on disk) and the bare link is refused" \
            if job.signed else "the origin refused the link kept on disk"
        return (f"; {why}: paste the download link again (Download…, or `swarmllm download URL`) "
                "and it resumes from the bytes kept")

    async def _async_part(self, session: aiohttp.ClientSession, job: DownloadJob, i: int, part: Path,
                          io: concurrent.futures.Executor, progress: Callable[[DownloadJob], None],
                          done_before: int) -> tuple[int, str]:
        """Fetch (with retries, resuming) and check part i (0-based) of the job's files: (size, sha256).
        A failure's DownloadFailed names the part of a split set; a wrong file's `.part` is removed."""
        loop = asyncio.get_running_loop()
        url, name = job.parts[i]
        where = f"part {i + 1} of {len(job.parts)} ({name}): " if len(job.parts) > 1 else ""
        one = DownloadJob(job.id, url, name, job.sha256 if i == job.named else None, stop=job.stop,
                          total_bytes=job.part_bytes[i],
                          set_named=(job.parts[job.named][0], job.sha256) if len(job.parts) > 1 else None)
        resumed_before, attempts_before, fetched_before = job.resumed_from, job.attempts, job.fetched_bytes

        def step(one: DownloadJob) -> None:  # this part's progress as the whole set's
            job.state, job.done_bytes = one.state, done_before + one.done_bytes
            job.resumed_from, job.attempts = resumed_before + one.resumed_from, attempts_before + one.attempts
            job.fetched_bytes = fetched_before + one.fetched_bytes
            job.linked_sha256 = one.linked_sha256
            if one.total_bytes is not None:
                job.part_bytes[i] = one.total_bytes
            known = [b for b in job.part_bytes if b is not None]
            job.total_bytes = sum(known) if len(known) == len(job.parts) else None
            progress(job)

        try:
            while True:
                one.attempts += 1
                job.attempts = attempts_before + one.attempts
                try:
                    await async_fetch(session, one, part, io, models_dir=self.models_dir, progress=step)
                    break
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError, Retryable) as exc:
                    if (bad_cert := cert_failure(exc, one.url)) is not None:  # another attempt fares no better
                        raise DownloadFailed(bad_cert) from exc
                    error = describe_error(exc)
                    if one.attempts >= const.DOWNLOAD_RETRIES:
                        kept = " (the partial file is kept: downloading it again resumes)" \
                            if await loop.run_in_executor(io, size_or_zero, part) else ""
                        raise DownloadFailed(f"failed {one.attempts} times; last: {error}{kept}") from exc
                    asked = exc.retry_after_s if isinstance(exc, Retryable) else None
                    delay = max(retry_delay(one.attempts), asked or 0.0)  # the server's Retry-After, capped
                    log.info("DIAG: model download interrupted, resuming %s", kv(
                        download=job.id, part=i + 1 if where else None, done_bytes=one.done_bytes,
                        attempt=one.attempts, retry_in_s=round(delay, 2), retry_after_s=asked, error=error))
                    await asyncio.sleep(delay)
            one.state = "verifying"
            step(one)
            size, digest = await loop.run_in_executor(io, size_and_sha256, part, job.stop)
            if one.total_bytes is not None and size != one.total_bytes:
                raise DownloadFailed(f"got {size} bytes, the server announced {one.total_bytes}", discard=True)
            if one.sha256 is not None and digest != one.sha256:
                raise DownloadFailed(f"sha256 mismatch: expected {one.sha256}, got {digest} (file removed)",
                                     discard=True)
            if one.sha256 is None and one.linked_sha256 is not None and digest != one.linked_sha256:
                raise DownloadFailed(f"sha256 mismatch: the Hub states {one.linked_sha256} (X-Linked-Etag), "
                                     f"got {digest} (file removed)", discard=True)
            return size, digest
        except DownloadFailed as exc:
            if exc.discard:  # what is on disk is wrong (not a GGUF, bad hash): nothing of it stays
                await loop.run_in_executor(io, discard_part, part)
            raise DownloadFailed(where + exc.message, origin_status=exc.origin_status) from exc
        except aiohttp.ClientError as exc:  # redirects, bad URLs: their text may hold a signed URL
            raise DownloadFailed(f"{where}{type(exc).__name__} fetching {display_url(url)}") from exc
        except OSError as exc:  # disk full, permissions
            raise DownloadFailed(where + await self._async_disk_error(exc, part, io)) from exc

    async def _async_alone(self, job: DownloadJob, digest: str, io: concurrent.futures.Executor) -> None:
        """A split part fetched alone is in models/: the set is served once its last part is here,
        else the job's note names the parts still missing."""
        loop = asyncio.get_running_loop()
        missing = [name for _url, name in job.others
                   if not await loop.run_in_executor(io, (self.models_dir / name).exists)]
        if missing:
            job.note = alone_note(job.file_name, len(job.others) + 1, missing)
            log.info("DIAG: model download of one part of a split set %s", kv(
                download=job.id, file=job.file_name, missing=",".join(missing)))
            return
        part = split_part(Path(job.file_name))
        if part is not None and part[1] == 1:  # part 1 came last: its hash is known
            job.model_id = await self.on_file(self.models_dir / job.file_name, digest, display_url(job.url), job.url)
        else:  # part 1's hash is the catalog's to compute (and its origin is not checked: sha256 None)
            job.model_id = await self.on_file(self.models_dir / job.others[0][1], None, job.others[0][0], job.url)

    def _settle(self, job: DownloadJob) -> None:
        """The job's task ended: a task cancelled before it ever ran must not leave the job active."""
        if job.active and job.user_paused and not job.user_cancelled:  # paused before it ran: its part stays
            job.state, job.finished_at = "paused", time.time()
            log.info("DIAG: model download paused %s", kv(download=job.id, done_bytes=job.done_bytes, before="start"))
            self._observers.emit(job)
        elif job.active:
            job.state, job.error, job.finished_at = "cancelled", "cancelled before it started", time.time()
            self._observers.emit(job)
        self._forget_finished()

    async def _async_disk_error(self, exc: OSError, part: Path | None, io) -> str:
        """A failed write said with where and what to do ("OSError: No space left on device" named
        neither): the partial file stays for a resume, so its size is said, to free it by hand."""
        try:
            kept = await asyncio.get_running_loop().run_in_executor(io, size_or_zero, part) if part else 0
        except OSError:  # not even its size can be read: nothing said of it
            kept = 0
        part_note = (f"; the partial file {part} ({kept / 1e6:.0f} MB) is kept: downloading it again resumes, "
                     "or delete it") if kept else ""
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return f"the disk is full: no space left in {self.models_dir} (free some space there){part_note}"
        where = exc.filename or self.models_dir
        return f"cannot write {where} ({exc.strerror or exc}){part_note}"

    def _fail(self, job: DownloadJob, message: str) -> None:
        job.state, job.error, job.finished_at = "failed", message, time.time()
        log.warning("DIAG: model download failed %s", kv(download=job.id, url=display_url(job.url), error=message))
