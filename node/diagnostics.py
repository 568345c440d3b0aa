"""The plain-text diagnostics report (`GET /api/admin/diagnostics`, `swarmllm diagnostics`).

Safe to paste in public by default: every address and host name is redacted with a per-report
salted tag (node.redact), file paths and the API key never appear. `full=True` keeps addresses.
Sections follow DESIGN.md §9, in order.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from node import const
from node.inference import llamacpp
from node.inference.pipeline.coverage import swarm_coverage
from node.inference.pipeline.layerchoice import Span, layer_counts
from node.inference.torchload import torch_loaded
from node.logs import clean_text, cut_for_redaction
from node.redact import Redactor
from node.trace import FAILED_OUTCOMES

REPORT_LINE_MAX_CHARS = 16384  # one row of the report (a row is one line; the fields in it are bounded)

if TYPE_CHECKING:
    from node.config import NodeConfig
    from node.inference.manager import ModelManager
    from node.inference.pipeline.coordinator import PipelineCoordinator
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.remote_serve import RemoteGenerateServer
    from node.models.download import ModelDownloader
    from node.net import PeerManager
    from node.sysinfo import MachineInfo
    from node.trace import RequestTrace, TraceHub


@dataclass(frozen=True)
class ReportParts:
    """What the report reads, handed over by the node (the report never reaches into a Node)."""

    agent: str
    short_id: str
    config: NodeConfig
    api_port: int | None
    api_key: str  # only to be redacted, never printed
    started_at: float | None
    host_names: list[str]  # this machine's names, redacted from the text
    user_names: list[str]  # the user's login and full name (every form a file name gives), redacted
    activity: list[str]
    traces: TraceHub
    machine: Callable[[], Awaitable[MachineInfo]]  # waits for the first measurement
    models: ModelManager
    slice_host: SliceHost
    downloads: ModelDownloader
    peers: PeerManager | None
    pipeline: PipelineCoordinator | None
    remote: RemoteGenerateServer | None = None  # remote generate for others on models held whole
    skipped_models: list[str] = field(default_factory=list)  # ModelCatalog.skipped_reasons()
    ignored_models: list[str] = field(default_factory=list)  # ModelCatalog.ignored_reasons()
    waiting_on: list[str] = field(default_factory=list)  # what the start left under way (Node.waiting_on)
    choice_failures: list[str] = field(default_factory=list)  # the layer choice's last failed loads (AutoServe.failures)


def _int8_kernel_line() -> str:
    """Which int8 kernel this machine runs slices on, and the measurement that chose it."""
    from node.inference.weights import kernels, qgemm
    from node.inference.weights.linear import fbgemm_available

    if qgemm.available():
        isa = qgemm.isa()
        prefill = "8-bit prefill activations" if isa == "avx512vnni" else "16-bit activations throughout"
        head = f"int8 kernels: qgemm ({isa}, {prefill})" + ("" if fbgemm_available() else "; no fbgemm in this torch")
    elif fbgemm_available():
        head = "int8 kernels: fbgemm only (qgemm not built)"
    else:
        head = "int8 kernels: none (qgemm not built, no fbgemm in this torch): auto slices run in f32"
    chosen = [f"{r['kernel']} at width {r['width']} (request {r['qgemm_request_ms']} ms qgemm, "
              f"{r['fbgemm_request_ms']} ms fbgemm, measured {r['measured_at']})"
              for r in kernels.chosen_records() if "qgemm_request_ms" in r]
    return head + (f"; chosen: {'; '.join(chosen)}" if chosen else "")


def _uptime(seconds: float) -> str:
    seconds = int(seconds)
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return (f"{days}d " if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _failed(counts: Mapping[str, int]) -> str:
    """'N failed' over every outcome the failure ring keeps, naming the ones that are no error: a
    stream cut off because its client took nothing (2026-12-07, review r28: the header counted only
    `error`, so those left the header while the ring listed them)."""
    failed = sum(counts.get(o, 0) for o in FAILED_OUTCOMES)
    others = [f"{counts[o]} {o}" for o in FAILED_OUTCOMES if o != "error" and counts.get(o, 0)]
    return f"{failed} failed" + (f" ({', '.join(others)})" if others else "")


def _header(node: ReportParts, r: Redactor) -> list[str]:
    counts = node.traces.counts
    uptime = time.time() - node.started_at if node.started_at else 0
    api = r.address(node.config.host, node.api_port)
    peers = node.peers
    reach = f"api {api}" + (" (loopback only)" if node.config.host in ("127.0.0.1", "::1", "localhost") else "")
    reach += "; peer network " + ("on" if peers is not None else "off")
    swarm_line = "swarm: (peer network off)"
    if peers is not None:
        st = peers.swarm_ops.status()
        refused = st["refused"]
        swarm_line = (f"swarm: {st['swarm']}" + (" (open: any node that opted in)" if st["open"] else
                                                 f" (private, epoch {st['epoch']})")
                      + f"  members connected: {st['members_connected']}"
                      + f"  refused: {len(refused)} peer(s), {sum(r['count'] for r in refused)} time(s)")
    return [
        f"SwarmLLM diagnostics — {node.agent}",
        f"node: {node.short_id}  uptime: {_uptime(uptime)}",
        f"reachability: {reach}",
        swarm_line,
        f"requests: {counts.get('started', 0)} started, {counts.get('ok', 0)} ok, {_failed(counts)}, "
        f"{counts.get('cancelled', 0)} cancelled",
        f"in_flight: {node.traces.in_flight} traces, "
        f"{node.pipeline.in_flight if node.pipeline is not None else 0} pipelines",
        # UTC, as node.log's lines and the activity stamps: a local time (its zone an abbreviation, or
        # none) read against a log from another zone was hours off (2026-12-07)
        f"generated: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  redacted: {'no' if not r.enabled else 'yes'}",
    ]


async def _machine(node: ReportParts) -> list[str]:
    m = await node.machine()
    lines = [
        f"cpu: {m.cpu}" + (f"  ({' '.join(m.cpu_features)})" if m.cpu_features else ""),
        f"cores: {m.physical_cores} physical, {m.logical_cores} logical",
        f"ram: {m.ram_total_mb} MiB total, {m.ram_available_mb} MiB available",
        f"os: {m.os}  python: {m.python}",
    ]
    if m.gpus:
        for i, g in enumerate(m.gpus):
            free = "free not read (no load yet)" if g.free_mb is None else f"{g.free_mb} MiB free"
            lines.append(f"gpu{i}: {g.name} (sm {g.compute_capability}) vram {g.total_mb} MiB, {free}")
    else:
        lines.append("gpu: none")
    if node.slice_host.slices:
        rates = [f"{s.start}-{s.end - 1}:{s.ms_per_layer:.3f}" for s in node.slice_host.slices.values()
                 if s.ms_per_layer]
        lines.append(f"measured ms/layer (decode): {', '.join(rates) or 'not yet measured'}")
        kernels = sorted({f"{s.model.fmt} {s.model.kernel} kv {s.model.kv_name}"
                          for s in node.slice_host.slices.values() if s.model is not None})
        cache = node.slice_host.weight_cache
        used = await asyncio.get_running_loop().run_in_executor(None, cache.total_bytes) \
            if cache is not None and cache.enabled else None
        lines.append(f"slice kernels: {', '.join(kernels) or 'none loaded'}; weight cache: "
                     + (f"{used / 2**20:.0f} of {cache.budget_bytes / 2**20:.0f} MiB" if used is not None else "off"))
    if torch_loaded():  # (the kernels' modules import torch: off the loop, even when it is loaded)
        lines.append(await asyncio.get_running_loop().run_in_executor(None, _int8_kernel_line))
    else:  # not imported for a report: a node hosting no slice never loads it (2026-12-07)
        lines.append("int8 kernels: not checked (torch not loaded: this node hosts no slice)")
    if m.mem_bandwidth_gbps is None:
        lines.append(f"memory bandwidth: could not be measured ({m.bandwidth_error})")
    else:
        lines.append(f"memory bandwidth: {m.mem_bandwidth_gbps:.1f} GB/s (measured)")
    lines.append(f"advertised speed: {m.advertised_speed}")
    decided = llamacpp.decision()
    if decided is not None:  # only once a model or tokenizer made the node import llama.cpp
        use, why = decided
        lines.append(f"llama.cpp extra weight buffers (repack/AMX): {'on' if use else f'off ({why})'}")
    return lines


def _reachable(node: ReportParts, r: Redactor) -> list[str]:
    lines = [f"api: {r.address(node.config.host, node.api_port)}"]
    peers = node.peers
    if peers is None:
        lines.append("peer listener: not running")
    else:
        lines += [f"peer: {where}" for where in peers.reachable_at()]
        cfg = node.config
        lines.append(f"mdns: {'on' if cfg.mdns else 'off'}  relay service: {'on' if cfg.relay else 'off'}"
                     f"  direct dialling: {'off (relays only)' if cfg.no_direct else 'on'}")
    return lines


def _field(r: Redactor, text: str, max_chars: int) -> str:
    """A field as the report shows it: cut (to twice its bound), redacted, then made one line and cut
    to its bound; redacted before it is escaped (`\n/home/ana` is no path to a redactor; review r64)
    and cut before it is redacted (a 64 KB field took the redactor seconds; review r67)."""
    return clean_text(r.text(cut_for_redaction(text, max_chars)), max_chars)


def _render(r: Redactor, sections: list[tuple[str | None, list[str]]]) -> str:
    """The report's text from its sections' rows (CPU work: run in an executor)."""
    out: list[str] = []
    for title, lines in sections:
        if title:
            out.append("")
            out.append(f"-- {title} --")
        # every row one line, whatever a field held: a model's load error quotes llama.cpp, which
        # quotes the GGUF's own strings (a header a peer sent), and a newline there wrote lines of
        # its own into the report, a `DIAG: request complete` one included (a bug hunt, 2026-12-07)
        out.extend(_field(r, line, REPORT_LINE_MAX_CHARS) for line in lines)
    # Belt and braces: redact anything address-like that a section wrote as free text.
    return r.text("\n".join(out)) + "\n"


def _ago(ts: float | None) -> str:
    return "never" if ts is None else f"{max(0.0, time.time() - ts):.0f}s ago"


def _peers(node: ReportParts, r: Redactor) -> list[str]:
    if node.peers is None:
        return ["(peer network not running)"]
    rows = []
    skews = node.peers.clock.skews_s  # a linked peer's clock minus ours (its HELLO), seconds
    for p in node.peers.peers():
        models = ", ".join(_advert(m) for m in p.models) or "-"
        skew = skews.get(p.node_id) if p.state == "connected" else None
        rtt = f"{p.rtt_ms:.2f}" if p.rtt_ms is not None else "-"
        addr = p.address or "-"
        rows.append(f"{p.short_id} {p.state} transport={p.transport or '-'} addr={addr} rtt_ms={rtt} "
                    f"rto_ms={p.rto_ms:.0f} last_seen={_ago(p.last_seen)} models={models}"
                    + (f" region={clean_text(p.region, 64)}" if p.region else "")
                    + (f" agent={_field(r, p.agent, 300)}" if p.agent else "")
                    + (f" clock_skew_s={skew:+.0f}" if skew is not None and abs(skew) > const.CLOCK_SKEW_WARN_S
                       else "")
                    + (f" error={_field(r, p.last_error, 300)}" if p.last_error and p.state != "connected" else ""))
    for ref in node.peers.swarm_ops.status()["refused"]:
        rows.append(f"{ref['peer']} refused ({'not in this swarm' if ref['by_us'] else 'refused this node'}) "
                    f"swarm={ref['swarm'] or '-'} count={ref['count']} last={ref['last_s_ago']:.0f}s ago"
                    + (f" hint: {ref['hint']}" if ref.get("hint") else ""))
    return rows or ["(no peers)"]


def _advert(m: object) -> str:
    """One model a peer advertises, as its HELLO said it (the peer's word: any shape, any text)."""
    if not isinstance(m, dict):
        return "?"
    name = m.get("name")
    name = clean_text(name, 120) if isinstance(name, str) else "?"
    start, end = m.get("start"), m.get("end")
    if "start" not in m:
        return f"{name}[whole]"
    if type(start) is int and type(end) is int:
        return f"{name}[{start}-{end - 1}]"
    return f"{name}[?]"


def _failures(node: ReportParts, r: Redactor) -> list[str]:
    rows = list(node.traces.failures)
    if not rows:
        return ["(none)"]
    out = []
    for t in rows:
        out.append(t.summary_line(public=True))
        error = t.public_error(redact=r.text)
        if error:
            out.append(f"    error: {error}")
    return out


def _request_row(t: RequestTrace, r: Redactor) -> str:
    """A recent request's row: its summary line, and for one that failed why, short and redacted as
    the failures section's (2026-12-07: the row said `outcome=error error_type=X` only, the cause
    was in the log and in the failures ring, which keeps fewer); `failed_over=` the causes of
    attempts that failed before the last (the request may still have ended ok)."""
    row = t.summary_line(public=True)
    if t.failure_causes:
        row += " failed_over=" + ",".join(clean_text(c, 40) for c in t.failure_causes[-8:])
    error = t.public_error(redact=r.text)
    if error is None and t.outcome in FAILED_OUTCOMES:
        error = t.outcome  # (stalled: the node cut off a stream its client took nothing of)
    if error is not None and (t.outcome in FAILED_OUTCOMES or t.error_type is not None):
        # (a client error's text names its status already)
        status = f"status={t.error_status} " if t.error_status is not None and t.error_status >= 500 else ""
        row += f"  error: {status}{error}"  # (as bounded as the failures section's)
    return row


def _recent(node: ReportParts, r: Redactor) -> list[str]:
    rows = list(node.traces.recent)
    return [_request_row(t, r) for t in rows] or ["(none)"]


def _served_for_others(node: ReportParts) -> list[str]:
    rows = []
    for s in node.slice_host.slices.values():
        st = s.served
        if not st.steps:
            continue
        rows.append(f"{s.entry.id} layers={s.start}-{s.end - 1} sessions={st.sessions} steps={st.steps} "
                    f"tokens={st.tokens} eval_ms={st.eval_ms:.0f} bytes_in={st.bytes_in} bytes_out={st.bytes_out} "
                    f"coordinators={','.join(sorted(st.coordinators))}")
    rs = node.remote
    if rs is not None and (rs.served or rs.in_flight):
        rows.append(f"whole models (remote generate) generations={rs.served} in_flight={rs.in_flight} "
                    f"tokens={rs.tokens} coordinators={','.join(sorted(rs.coordinators))}")
    return rows or ["(nothing served for peers)"]


def _peer_performance(node: ReportParts, r: Redactor) -> list[str]:
    if node.pipeline is None or not node.pipeline.perf:
        return ["(no peer measurements)"]
    rows = []
    for node_id, perf in sorted(node.pipeline.perf.items()):
        snap = node.peers.peer(node_id) if node.peers is not None else None
        linked = snap is not None and snap.state == "connected"
        rtt = f"{snap.rtt_ms:.2f}" if linked and snap.rtt_ms is not None else "-"
        mpl = f"{perf.ms_per_layer:.3f}" if perf.ms_per_layer is not None else "-"
        ewma = f"{perf.ewma_step_ms:.1f}" if perf.ewma_step_ms is not None else "-"
        region = (snap.region if snap is not None else None) or "-"
        # a peer gone (its link down, or out of the table) kept a row that read as current until the
        # table forgot it (PEER_FORGET_S, an hour): it says so, and how old its figures are (2026-12-07)
        gone = "" if linked else (f" GONE ({snap.state}, last seen {_ago(snap.last_seen)})" if snap is not None
                                  else " GONE (not in the peer table)")
        rows.append(f"{node_id[:8]} rtt_ms={rtt} ms_per_layer={mpl} ewma_ms={ewma} samples={perf.samples} "
                    f"region={region} measured={_ago(perf.measured_at)}{gone}")
    if node.pipeline.hop_overhead_ms is not None:
        rows.append(f"per-hop overhead (ewma, decode steps): {node.pipeline.hop_overhead_ms:.2f} ms")
    prefix = node.pipeline.prefix
    if prefix.stats.hits or prefix.stats.misses:
        st = prefix.stats
        rows.append(f"chain prefix reuse: hits={st.hits} misses={st.misses} cached_tokens={st.cached_tokens} "
                    f"copies={st.copies} kept={len(prefix)} evictions={st.evictions} gone_on_segment={st.gone_on_segment}")
    return rows


def _coverage(node: ReportParts) -> list[str]:
    """Per model: each stretch of layers with the same holders (short ids, their advertised
    ms/layer), gaps named plainly."""
    peers = node.peers.peers() if node.peers is not None else []
    rows: list[str] = []
    for cov in sorted(swarm_coverage(node.short_id, node.slice_host.adverts(loading=True), peers).values(), key=lambda c: c.name):
        n = cov.n_layers
        # a whole-model holder (llama.cpp, remote generate) holds every layer; a range still
        # loading (its layers arriving) holds none yet: listed, not counted
        loading = set(cov.loading)
        everything = [*(s for s in cov.spans if s not in loading), *(Span(h, 0, n, None) for h in cov.whole)]
        counts = layer_counts(n, everything) if everything else [0] * n
        rows.append(f"{clean_text(str(cov.name), 120)} ({n} layers, sha {cov.sha256[:8]}): min holders per layer "
                    f"{min(int(c) for c in counts) if n else 0}" + (" (auto: " + ", ".join(
                        sorted(h[:8] for h in cov.budgets)) + ")" if cov.budgets else ""))
        holders_at = [tuple(sorted({(s in loading, s.node_id[:8], s.ms_per_layer) for s in cov.spans
                                    if s.start <= layer < s.end})) for layer in range(n)]
        start = 0
        for layer in range(1, n + 1):
            if layer < n and holders_at[layer] == holders_at[start]:
                continue
            who = [(h, ms) for arriving, h, ms in holders_at[start] if not arriving]
            coming = [h for arriving, h, _ in holders_at[start] if arriving]
            text = ", ".join(f"{h} ({ms:.3f} ms/layer)" if ms is not None else f"{h} (not measured)"
                             for h, ms in who) or ("no slice (held by the whole holders below)" if cov.whole
                                                   else "NO HOLDER")
            if coming:
                text += f" (loading: {', '.join(coming)})" if not who and not cov.whole else \
                    "".join(f", {h} (loading)" for h in coming)
            rows.append(f"  layers {start}-{layer - 1}: {text}")
            start = layer
        if cov.whole:
            rows.append(f"  whole (llama.cpp): {', '.join(sorted(h[:8] for h in cov.whole))}")
    return rows or ["(no model is served in layers here or by peers)"]


def _origin(url: str | None, r: Redactor) -> str:
    """Where a partial model's layers come from: its origin's host, or the swarm's peers alone (a
    model made from a holder's header: no origin named; before 2026-12-06 shown as a made-up
    `<host-…>` tag, the tag of "?")."""
    host = urllib.parse.urlsplit(url or "").hostname
    return r.host(host) if host else "peers (no origin named)"


def _models(node: ReportParts, r: Redactor) -> list[str]:
    rows = []
    for served in node.models.all():
        e = served.entry
        reason = f" reason={served.cpu_placement_reason}" if served.cpu_placement_reason else ""
        rows.append(f"{served.id}  arch={_field(r, e.architecture, 120)} layers={e.n_layers} ctx={served.n_ctx} "
                    f"quant={e.quantization} size_mb={e.size_bytes / 2**20:.1f} state={served.state} "
                    f"device={served.device or '-'}{reason}"
                    + (f" partial=\"{e.partial.describe()}\" from={_origin(e.origin_url, r)}" if e.partial else "")
                    + (f" error={_field(r, served.error, 1000)}" if served.error else "")
                    + (" (not loaded again for requests until its file changes, another model is unloaded or a few "
                       "minutes pass; an admin or app load tries again)"
                       if served.state == "failed" and served.failure is not None and served.tokenizer is not None
                       else ""))
    for hosted in node.slice_host.slices.values():
        info = hosted.summary()
        rows.append(f"{hosted.entry.id}  layers={hosted.start}-{hosted.end - 1} of {hosted.entry.n_layers} "
                    f"engine=torch-slice dtype={info['dtype']} kernel={info['kernel']} state={hosted.state} "
                    f"device={info['device']} "
                    f"kv_sessions={info['sessions']} kv_kept={info['kept_sessions']} kv_mb={info['kv_mb']}"
                    + (f" load_ms={info['load_ms']} weight_cache={info['weight_cache']}" if info["load_ms"] is not None else "")
                    + (f" fetched_mb={hosted.fetch[0] / 2**20:.1f}/{hosted.fetch[1] / 2**20:.1f}"
                       if hosted.fetch is not None else "")  # its layers arriving (a partial model)
                    + (f" error={_field(r, hosted.error, 1000)}" if hosted.error else ""))
    for what in node.choice_failures:  # (the failed slice itself is unloaded at once)
        rows.append(f"failed: {_field(r, what, REPORT_LINE_MAX_CHARS)}")
    for why in node.skipped_models:  # a file in the models folder (or --model) it could not serve
        rows.append(f"skipped: {_field(r, why, REPORT_LINE_MAX_CHARS)}")
    for why in node.ignored_models:  # a GGUF that is not a model (projector, adapter, vocabulary)
        rows.append(f"not a model: {_field(r, why, REPORT_LINE_MAX_CHARS)}")
    for what in node.waiting_on:  # a --model URL whose origin has not answered (it opens in the background)
        rows.append(f"waiting: {_field(r, what, REPORT_LINE_MAX_CHARS)}")
    return rows or ["(no models)"]


def _downloads(node: ReportParts, r: Redactor) -> list[str]:
    rows = []
    for job in node.downloads.all()[-10:]:
        host = urllib.parse.urlsplit(job.url).hostname or "?"
        total = f"{job.total_bytes / 2**20:.1f}" if job.total_bytes else "?"
        rows.append(f"{job.file_name}  state={job.state} mb={job.done_bytes / 2**20:.1f}/{total} "
                    f"attempts={job.attempts} from={r.host(host)}" + (f" error={_field(r, job.error, 1000)}" if job.error else ""))
    return rows or ["(none this run)"]


def report_redactor(node: ReportParts, *, full: bool = False) -> Redactor:
    """The one redactor of a report: everything pasted with it goes through this (one salt, so a
    host keeps its tag across the whole text)."""
    # Names no pattern can spot: this machine's, and the configured API, peer, bootstrap and relay hosts.
    known_hosts = [*node.host_names, socket.gethostname(), node.config.host]
    if node.config.peer_host:
        known_hosts.append(node.config.peer_host)
    for addr in [*node.config.bootstrap, *node.config.relays]:
        host = addr.rsplit(":", 1)[0].strip("[]")
        if host:
            known_hosts.append(host)
    return Redactor(enabled=not full, secrets_to_hide=[node.api_key], known_hosts=known_hosts,
                    user_names=node.user_names)


async def build_report(node: ReportParts, *, full: bool = False, lead: Sequence[str] = ()) -> str:
    """Render the whole report; redacted unless full. `lead`: lines put first (the desktop app's
    reason a node could not start), redacted with the report by the same redactor."""
    r = report_redactor(node, full=full)
    sections: list[tuple[str | None, list[str]]] = [
        (None, [*lead, *([""] if lead else []), *_header(node, r)]),
        ("this machine", await _machine(node)),
        ("reachable at", _reachable(node, r)),
        ("peers", _peers(node, r)),
        ("recent inference failures", _failures(node, r)),
        ("recent requests", _recent(node, r)),
        ("served for others", _served_for_others(node)),
        ("peer serving performance", _peer_performance(node, r)),
        ("swarm coverage", _coverage(node)),
        ("models", _models(node, r)),
        ("downloads", _downloads(node, r)),
        ("recent activity", list(node.activity[-30:]) or ["(none)"]),
    ]
    # (redacting every row is CPU work, tens of ms for a large report: off the event loop)
    return await asyncio.get_running_loop().run_in_executor(None, _render, r, sections)
