"""The Node: one object that owns every part of a running SwarmLLM node.

The same object runs headless (`swarmllm run`, asyncio.run) and inside the tray app (qasync
loop): `await node.start()` ... `await node.stop()`. It composes the parts; the parts do the work.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from node import AGENT, __version__, const
from node.api.server import ApiServer
from node.config import NodeConfig
from node.contribute import Contributions
from node.datadir import MODELS_DIR, WEIGHT_CACHE_DIR, DataDirLock, ensure_data_dir, load_or_create_api_key
from node.diagnostics import ReportParts, build_report
from node.errors import ShuttingDown
from node.hello import HelloParts
from node.inference.choices import ChoicesRun
from node.inference.generate import CompletionRun
from node.inference.headers import HeaderServer
from node.inference.manager import ModelManager
from node.inference.pipeline import fixed
from node.inference.pipeline.autoserve import AutoServe
from node.inference.pipeline.coordinator import PipelineCoordinator
from node.inference.pipeline.embed_remote import RemoteEmbedder
from node.inference.pipeline.embed_serve import RemoteEmbedServer
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.hosted import parse_layers
from node.inference.pipeline.part_server import PartServer
from node.inference.pipeline.partials import PartialModels
from node.inference.pipeline.remote_serve import RemoteGenerateServer
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.worker import SegmentWorker
from node.inference.request import CompletionRequest
from node.inference.swarm_models import SwarmModels
from node.inference.weights.cache import WeightCache
from node.locks import KeyedLocks
from node.logs import kv, region_code
from node.metrics import NodeMetrics
from node.model_actions import ModelActions
from node.model_files import ModelFiles
from node.models.catalog import ModelCatalog, ModelEntry
from node.models.download import ModelDownloader
from node.models.header import HEADERS_DIR, HeaderCache
from node.models.sources import model_sources
from node.net import FrameType, PeerManager, async_load_or_create_identity
from node.observe import Observers
from node.origin_checks import OriginChecks
from node.status import node_ready, node_stats
from node.stopping import async_bounded, async_drain, async_drain_others
from node.swarm_actions import SwarmActions
from node.sysinfo import MachineInfo, collect, host_names, user_names
from node.trace import RequestTrace, TraceHub
from node.url_models import UrlModels
from node.watchdog import LoopWatchdog

log = logging.getLogger(__name__)


class Node(HelloParts, SwarmActions, UrlModels, ModelActions):
    """A SwarmLLM node: API server, models, slices, peer network, pipeline, traces, diagnostics.

    Implements node.api.view.NodeView, the narrow view the HTTP handlers get."""

    def __init__(self, config: NodeConfig):
        self.config = config
        self.data_dir: Path = config.data_dir
        self._data_dir_lock = DataDirLock(self.data_dir)
        self.version = __version__
        self.agent = AGENT
        self.api_key = ""
        self.identity = None
        self.metrics = NodeMetrics()
        self.traces = TraceHub(self.metrics)
        self.catalog = ModelCatalog(self.data_dir)
        self.models = ModelManager(config, self.catalog)
        self.downloads = ModelDownloader(
            self.data_dir / MODELS_DIR,
            self._async_downloaded)
        self.model_files = ModelFiles(self)  # files added to or removed from models/ while it runs
        self.api = ApiServer(self, config)
        self.watchdog = LoopWatchdog()
        self.machine: MachineInfo | None = None
        self.peers: PeerManager | None = None
        weight_cache = WeightCache(self.data_dir / WEIGHT_CACHE_DIR, int(config.slice_weight_cache_mb * 2**20))
        self.partials = PartialModels(self.data_dir / MODELS_DIR, weight_cache, note=self.note_activity)
        self.slice_host = SliceHost(dtype=config.slice_dtype, n_threads=config.n_threads, cpu_only=config.cpu_only,
                                    n_ctx=config.n_ctx, ctx_cap=config.max_ctx,
                                    kv_budget_bytes=int(config.slice_kv_budget_mb * 2**20),
                                    weight_cache=weight_cache, partials=self.partials,
                                    kv_dtype=config.slice_kv_dtype, catalog=self.catalog)
        self.transport: PipelineTransport | None = None
        self.worker: SegmentWorker | None = None
        self.pipeline: PipelineCoordinator | None = None
        self.swarm_models: SwarmModels | None = None  # models only peers hold (their headers fetched)
        self.autoserve: AutoServe | None = None  # chooses this node's layers (--serve auto, contributions)
        self.contributions = Contributions(config, self.catalog, self.slice_host, self.partials,
                                           announce=self._async_announce, note=self.note_activity)
        self.slice_host.on_file_changed = self.contributions.async_release_changed
        self.remote_server: RemoteGenerateServer | None = None  # runs GENERATE for others on whole models
        self.embed_server: RemoteEmbedServer | None = None  # runs EMBED for others on whole models
        self.embedder: RemoteEmbedder | None = None  # asks peers holding a model whole for embeddings
        self.started_at: float | None = None
        self.activity: collections.deque[str] = collections.deque(maxlen=const.ACTIVITY_RING_SIZE)
        self.swarm_events: Observers[[]] = Observers("swarm")  # a join, leave or remove ended (SwarmActions)
        self.host_names: list[str] = []  # this machine's names, redacted from reports
        self.user_names: list[str] = []  # the user's names, redacted from reports
        self._machine_task: asyncio.Task | None = None
        self._advertised_rates: dict[str, float] = {}  # model id -> ms/token peers last heard (whole models)
        self._announce_task: asyncio.Task | None = None
        self._announce_again = False  # _announce_soon asked again while its task runs
        self._stopping = False
        self._later_urls: list[str] = []  # --model URLs unreachable at start (opened in the background)
        self._pending_urls: dict[str, asyncio.Task] = {}  # --model URLs whose origin had not answered at start
        self._fixed_slices: list[tuple[ModelEntry, int, int]] = []  # the --layers slices (a late URL's joins them)
        self._url_tasks: list[asyncio.Task] = []
        # finished downloads' origin checks, cancelled and awaited at stop (they were in _url_tasks,
        # whose assignment in start() dropped one begun meanwhile: never cancelled)
        self.origin_checks = OriginChecks(config, self.catalog, self._async_announce)
        # (catalog generation, held_files, as a set): the whole files handed out unloaded, rebuilt only
        # when the catalog changed (2026-12-07: a pass over the catalog for every MODEL_PART request)
        self._held: tuple[int, list[str], frozenset[str]] = (-1, [], frozenset())
        self._runs: weakref.WeakSet[CompletionRun] = weakref.WeakSet()  # the requests under way (the drain ends them)
        # a path, or a sha256, being added → its lock and how many adds hold or wait for it (an add of it again waits)
        self._adding = KeyedLocks()  # adds of one path, and of one content, one after the other

    # --- identity ---

    @property
    def node_id(self) -> str:
        return self.identity.node_id if self.identity else ""

    @property
    def short_id(self) -> str:
        return self.node_id[:8]

    @property
    def stopping(self) -> bool:
        """True once stop() has begun (new requests get a 503; /health/ready says not ready)."""
        return self._stopping

    @property
    def api_url(self) -> str:
        # every network (0.0.0.0, ::): this machine's apps use localhost (a Host of 0.0.0.0 is refused)
        host = self.config.host
        if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::", ""):
            host = "localhost"
        elif ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return f"http://{host}:{self.api.port or self.config.port}/v1"

    # --- lifecycle ---

    async def start(self) -> None:
        """Create the data dir, load identity and models, start the API (returns when serving)."""
        started = time.monotonic()
        log.info("DIAG: daemon starting version=%s", self.version)
        loop = asyncio.get_running_loop()
        self.watchdog.start(loop)
        await loop.run_in_executor(None, ensure_data_dir, self.data_dir)
        await loop.run_in_executor(None, self._data_dir_lock.acquire)  # DataDirInUse: another node runs here
        await loop.run_in_executor(None, self.catalog.load_hashes)
        self.api_key = await loop.run_in_executor(None, load_or_create_api_key, self.data_dir)
        self.identity = await async_load_or_create_identity(self.data_dir)
        self.started_at = time.time()
        self._machine_task = asyncio.create_task(self._collect_machine(), name="machine-info")
        slices, auto = [], []
        url_dirs, url_dirs_all = await self._async_open_url_models()
        sources = await loop.run_in_executor(None, functools.partial(
            model_sources, self.data_dir, self.config.models, include_default=self.config.include_default_model,
            exclude=url_dirs_all))
        for entry in await self.catalog.async_scan(sources + [(d, "cli") for d in url_dirs]):
            as_slice = (bool(self.config.layers) or self.config.serve == "auto") and entry.source == "cli"
            if as_slice:  # (before anything loads: the slice engine failed later on part 1's tensors)
                entry.refuse_slices()
            if as_slice and self.config.serve == "auto":
                auto.append(entry)
            elif as_slice:
                slices.append((entry, *parse_layers(self.config.layers, entry.n_layers)))
            await self.models.async_register(entry, whole=not as_slice and entry.whole_ok)
        await self._start_network()
        self.models.subscribe(self._on_model_event)
        await self.downloads.async_restore()  # an earlier run's unfinished downloads, paused
        self.origin_checks.recheck_unchecked()  # downloads whose origin could not be checked (background)
        await self.api.start(self.api_key)
        self.note_activity(f"API listening on {self.config.host}:{self.api.port}")
        await self.models.async_load_all()
        retries = await fixed.async_load_at_start(self.slice_host, slices, self.note_activity) \
            if self.config.contribute else []
        if slices and not self.config.contribute:
            log.info("DIAG: contributing paused; the --layers slices load when it resumes %s",
                     kv(slices=len(slices)))
        if (slices or self.models.ready) and self.peers is not None:  # links made while loading heard none
            await self.peers.async_announce()
        # --serve auto's models, and the ones the desktop app helps serve (config's contribute_models)
        self.autoserve = AutoServe(self.node_id, self.slice_host, self.peers, auto, announce=self._async_announce,
                                   budget_mb=self.config.slice_budget_mb,
                                   reevaluate_s=self.config.serve_reevaluate_s, note=self.note_activity)
        self._fixed_slices = slices
        self.contributions.attach(self.autoserve, self._fixed_slices)
        await self.contributions.async_restore()
        self.autoserve.start()
        self.model_files.watcher.start()
        self._url_tasks = [asyncio.create_task(self.partials.async_open_later(url, self._async_serve_url_model),
                                               name="open-model-url") for url in self._later_urls]
        self._url_tasks += [asyncio.create_task(self.partials.async_open_pending(url, task, self._async_serve_url_model),
                                                name="open-model-url-pending") for url, task in self._pending_urls.items()]
        self._url_tasks += [self._load_later(slice_) for slice_ in retries] + self._repo_refreshes()
        log.info("DIAG: node started node_id=%s api=%s models=%d ready=%s elapsed_ms=%d", self.short_id,
                 self.api_url, len(self.models.all()), self.models.ready, (time.monotonic() - started) * 1000)

    async def stop(self) -> None:
        """Stop serving, free models, stop background tasks (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        if self._data_dir_lock.refused:  # another node runs here, node.log is its log: nothing started
            self.watchdog.stop()
            return
        log.info("DIAG: node stopping node_id=%s", self.short_id)
        self.catalog.stop_hashing()
        started = time.monotonic()
        stuck = []
        for name, step in self._stop_steps():
            if not await async_bounded(name, step(), const.NODE_STOP_STEP_S):
                stuck.append(name)
        if stuck:
            log.error("DIAG: node stop left steps behind %s", kv(node_id=self.short_id, stuck=",".join(stuck)))
        self.watchdog.stop()
        self._data_dir_lock.release()  # last: a node started next on this data dir finds it all written
        log.info("DIAG: node stopped %s", kv(node_id=self.short_id, in_flight=self.traces.in_flight,
                                              elapsed_ms=int((time.monotonic() - started) * 1000)))

    def _contributing(self) -> bool:
        """Whether this node takes new work from other nodes: not while paused, nor once it stops."""
        return self.config.contribute and not self._stopping

    def _work_for_others(self) -> int:
        """Remote generations and chain sessions under way here (the stop's drain waits for them;
        this node's own chain sessions end with its own requests, which the drain waits for too)."""
        remote = self.remote_server.in_flight if self.remote_server is not None else 0
        remote += self.embed_server.in_flight if self.embed_server is not None else 0
        return remote + sum(h.model.sessions.counts()[0] for h in list(self.slice_host.slices.values())
                            if h.model is not None and h.state in ("loaded", "draining"))

    def _stop_steps(self) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        """stop()'s steps in order, each an awaitable factory (bounded one by one)."""
        def closing(part: Any) -> Callable[[], Awaitable[None]]:
            async def close() -> None:
                if part is not None:
                    part.close()
            return close

        async def cancel_background() -> None:
            for task in (self._machine_task, self._announce_task, *self._url_tasks, *self._pending_urls.values()):
                if task is not None:
                    task.cancel()

        async def nothing() -> None:
            return None

        async def drain() -> None:  # its own requests and the work it runs for others, side by side
            await asyncio.gather(async_drain(self.traces, self._runs), async_drain_others(self._work_for_others))

        return [
            ("drain", drain),
            ("api", self.api.stop),
            ("autoserve", self.autoserve.async_stop if self.autoserve is not None else nothing),
            ("contributions", self.contributions.async_close),
            ("pipeline", closing(self.pipeline)),
            ("swarm models", closing(self.swarm_models)),
            ("remote generate", closing(self.remote_server)),
            ("remote embeddings", closing(self.embed_server)),
            ("embeddings asker", closing(self.embedder)),
            ("peers", self.peers.async_stop if self.peers is not None else nothing),
            ("background", cancel_background),
            ("models watch", self.model_files.watcher.async_stop),
            ("downloads", self.downloads.async_close),
            ("origin checks", self.origin_checks.async_stop),
            ("slices", self.slice_host.async_close),
            ("models", self.models.async_close),
        ]

    async def _start_network(self) -> None:
        """The peer network and the pipeline's worker/coordinator on top of it."""
        self.peers = PeerManager(self.config, self.identity, models_provider=self._hello_models,
                                 hardware_provider=self._hello_hardware, files_provider=self._hello_files,
                                 sampling_provider=self._hello_sampling)
        self.transport = PipelineTransport(self.node_id, self.peers)
        self.slice_host.on_advert = self._announce_soon
        self.slice_host.on_change = self._announce_soon  # (review r40: never wired, a check went unheard)
        self.worker = SegmentWorker(self.node_id, self.slice_host, self.transport,
                                    contributing=self._contributing)
        self.pipeline = PipelineCoordinator(self.node_id, self.transport, self.peers, self.slice_host,
                                            activation_bits=self.config.activation_bits,
                                            speculative_max_draft=self.config.speculative_max_draft,
                                            kv_cache_seqs=self.config.kv_cache_seqs,
                                            pauses=self.watchdog,
                                            region=region_code(self.config.region, const.REGION_MAX_CHARS))
        self.remote_server = RemoteGenerateServer(self.node_id, self.models, self.transport, self.peers,
                                                  contributing=self._contributing)
        self.embed_server = RemoteEmbedServer(self.node_id, self.models, self.transport, self.peers,
                                              contributing=self._contributing)
        self.embedder = RemoteEmbedder(self.node_id, self.transport, self.peers, self.pipeline.holders,
                                       self.pipeline.deadlines)
        self.worker.register()
        self.remote_server.register()
        self.embed_server.register()
        self.embedder.register()
        self.slice_host.on_sweep = self.worker.forget_expired
        self.pipeline.register()
        self.peers.register_handler(FrameType.MODEL_HEADER, HeaderServer(self.catalog).async_handle)
        self.peers.register_handler(FrameType.MODEL_PART, PartServer(
            self.catalog, contributing=self._contributing, shares_whole=self._shares_whole).async_handle)
        self.partials.attach(self.peers, self._slice_holders, self._whole_holders)
        self.swarm_models = SwarmModels(self.catalog, self.models, self.peers,
                                        HeaderCache(self.data_dir / HEADERS_DIR))
        self.models.swarm_lookup = self.swarm_models.async_wait_for
        await self.peers.async_start()
        self.swarm_models.start()
        self.contributions.origin_of = self.swarm_models.origin_of
        self.note_activity(f"peer listener on port {self.peers.listen_port}")

    async def _collect_machine(self) -> None:
        loop = asyncio.get_running_loop()
        self.host_names = await loop.run_in_executor(None, host_names)  # getfqdn may hit DNS
        self.user_names = await loop.run_in_executor(None, user_names)
        # a CPU-only node asks CUDA nothing (2026-12-07 review: every start read each GPU's memory)
        self.machine = await loop.run_in_executor(None, functools.partial(collect, gpus=not self.config.cpu_only))

    async def async_machine(self) -> MachineInfo:
        """The machine snapshot (waits for the first measurement)."""
        task = self._machine_task
        if self.machine is None and task is not None and not task.done():
            await asyncio.wait({task})  # its end, not its outcome: a failed start cancels it
        if self.machine is None:  # a node that never started (the tray's report says why it did not)
            await self._collect_machine()
        assert self.machine is not None
        return self.machine

    async def async_add_model(self, path: Path, source: str, *, sha256: str | None = None,
                              origin_url: str | None = None) -> str:
        """Serve a GGUF file that was not here at start (a download, the GUI's Add, the admin API, the
        models folder's watch): catalog it, register it (not loaded), tell peers. Returns its model
        id; the id of the same content if it was already here; ModelLoadError says why it cannot be
        served. `sha256`, when the caller hashed the file already, is not recomputed; `origin_url` (a
        download's URL) is advertised so nodes without the file fetch its header there."""
        return (await self.async_add_model_file(path, source, sha256=sha256, origin_url=origin_url))[0]

    async def async_add_model_file(self, path: Path, source: str, *, sha256: str | None = None,
                                   origin_url: str | None = None) -> tuple[str, bool]:
        """async_add_model, and whether the file was taken up: a model new here, or the file of a model
        whose own file is gone (moved: catalog._file_back). Adds of one path run one after the
        other (2026-12-07: a double-click on Add, or two `models add` at once, both hashed the file and
        raced on its registration: the second was told 404 "not ready", or both "added"): the second
        finds the first's model, registered."""
        async with self._adding.hold(str(path)):  # (as given: absolute from the API and the GUI)
            loop = asyncio.get_running_loop()
            if sha256 is not None:
                await loop.run_in_executor(None, self.catalog.remember_hash, path, sha256, origin_url)
            # and adds of one content, whatever the path says (2026-12-07, review r65: another spelling of
            # it, a linked folder or `..`, or a copy, raced as above): the second waits for the first's
            # registration. Hashed first, outside this lock (a large file takes minutes), once by the cache
            digest = await loop.run_in_executor(None, self.catalog.sha256_of, path, source)
            async with self._adding.hold(f"sha256:{digest}" if digest else None):
                return await self._async_add_model_file(path, source)

    async def _async_add_model_file(self, path: Path, source: str) -> tuple[str, bool]:
        loop = asyncio.get_running_loop()
        # a refused file of the models folder stays listed ("Not served: …") until it changes or goes;
        # one added from elsewhere (the GUI's Add, `models add`) is refused to its caller only
        in_folder = path.parent == self.data_dir / MODELS_DIR
        entry, how = await loop.run_in_executor(
            None, functools.partial(self.catalog.add_file, path, source, keep_refusal=in_folder))
        if how == "known":
            self.contributions.file_seen(entry)  # (a choice refused as "changed": its bytes may be back)
            return entry.id, False
        if how == "new":
            await self.models.async_register(entry)
            self.note_activity(f"model {entry.id} added ({source})")
        else:  # its file was gone (moved): this file is its file now, it can be loaded again
            self.models.note_entry(entry)  # (its row no longer says "file deleted")
            self.note_activity(f"model {entry.id}: its file is back ({source})")
        await self.contributions.async_file_back(entry)  # a "Help serve" kept while its file was gone
        if self.peers is not None:
            await self.peers.async_announce()
        return entry.id, True

    async def _async_downloaded(self, path: Path, sha256: str | None, origin: str | None, url: str) -> str:
        """A finished download: served at once (not shared unloaded), then its origin checked in the
        background (download/public.py): only a public one's file is listed in `files`. `url` is the
        finishing job's own URL, query included (an earlier job of the same file name may have had
        another: a bare link refused, then a signed one pasted)."""
        model_id = await self.model_files.async_add_downloaded(path, sha256=sha256, origin_url=origin)
        if sha256 is not None and origin and url:
            self.origin_checks.start(path, sha256, url)
        return model_id

    async def async_add_model_path(self, path: str, *, load: bool = False) -> tuple[dict[str, Any], bool]:
        """`POST /api/admin/models/add`: serve the GGUF at `path` (model_files.ModelFiles)."""
        return await self.model_files.async_add_path(path, load=load)

    # --- requests ---

    def new_run(self, request: CompletionRequest, trace: RequestTrace) -> CompletionRun | ChoicesRun:
        """The run that serves one completion, on whichever route serves its model (one that comes
        while the node stops is refused with a 503 when it starts); OpenAI's `n` > 1: a run per
        choice under one trace (node.inference.choices)."""
        if request.n > 1:
            return ChoicesRun(request, trace, self._choice_run, on_first_token=self.traces.first_token)
        return self._choice_run(request, trace, on_first_token=self.traces.first_token)

    def _choice_run(self, request: CompletionRequest, trace: RequestTrace,
                    on_first_token: Callable[[RequestTrace], None] | None = None) -> CompletionRun:
        """One run (a choice's reports its first token through its ChoicesRun)."""
        run = CompletionRun(self.models, request, trace, self.short_id, on_first_token=on_first_token,
                            pipeline=self.pipeline)
        self._runs.add(run)
        if self._stopping:
            run.abort(ShuttingDown("the node is shutting down; try another node or again later"))
        return run

    def pipelines_in_flight(self) -> int:
        """Distributed pipelines being executed by this node as coordinator."""
        return self.pipeline.in_flight if self.pipeline is not None else 0

    def is_ready(self) -> bool:
        """True once this node can serve (`status.node_ready`)."""
        return node_ready(self)

    # --- what the admin API and the GUI act on ---

    async def async_report(self, *, full: bool = False, lead: Sequence[str] = ()) -> str:
        """The diagnostics report (redacted unless full), `lead` lines first, redacted with it."""
        await self.async_machine()  # this machine's and its user's names come with its measurement
        return await build_report(self.report_parts(), full=full, lead=lead)

    def report_parts(self) -> ReportParts:
        """The parts the diagnostics report reads."""
        return ReportParts(
            agent=self.agent, short_id=self.short_id, config=self.config, api_port=self.api.port,
            api_key=self.api_key, started_at=self.started_at, host_names=list(self.host_names),
            user_names=list(self.user_names),
            activity=list(self.activity), traces=self.traces, machine=self.async_machine, models=self.models,
            slice_host=self.slice_host, downloads=self.downloads, peers=self.peers, pipeline=self.pipeline,
            remote=self.remote_server, skipped_models=self.catalog.skipped_reasons(),
            ignored_models=self.catalog.ignored_reasons(),
            waiting_on=self.waiting_on(),
            choice_failures=[f.text() for f in self.autoserve.failures()] if self.autoserve is not None else [])

    # --- the swarm (node.net does the work; the peer network must be running) ---

    def note_activity(self, text: str) -> None:
        """A line for the diagnostics report's recent-activity section."""
        stamp = time.strftime("%H:%M:%SZ", time.gmtime())  # UTC, as node.log and the report's `generated:`
        self.activity.append(f"{stamp} {text}")  # the oldest goes past ACTIVITY_RING_SIZE lines

    def stats(self) -> dict[str, Any]:
        """Counters for /api/admin/stats and the GUI overview (`status.node_stats`)."""
        return node_stats(self)
