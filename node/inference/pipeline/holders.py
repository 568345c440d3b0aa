"""Who holds which layers of a model right now, and the chain planned over them.

The holders of a model (matched by sha256, never by name) are this node's slices (`local`) and the
slices connected peers advertise in HELLO, each with its link's RTT and transport, and a ms/layer:
this coordinator's measured EWMA when it has one (perf.py), else the peer's advertised figure. A
peer serving the model whole with llama.cpp (`whole: true`) holds [0, n_layers) as one segment
(`Holder.whole`: remote generate), at its measured or advertised ms per token / n_layers. They
are the planner's input (planner.py), each with the range it has loaded: the planner may use any
sub-range of a sliced holder's range. A model is covered, and listed by `/v1/models`, when some
chain of holders spans all its layers (overlapping ranges together count). `assemble` plans one
attempt's chain, records it in the
request's trace and logs it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from node import const
from node.errors import InsufficientCapacity, SamplingUnsupportedBySwarm
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.perf import PeerPerformance
from node.inference.pipeline.planner import Holder, Plan, plan_kept_route, plan_route, sane_ms
from node.inference.pipeline.transport import PipelineTransport
from node.inference.sampling import lacking
from node.logs import kv
from node.models.catalog import ModelEntry
from node.net import FrameType
from node.trace import RequestTrace, SegmentTrace
from node.values import is_int

log = logging.getLogger(__name__)


def _serves(m: Any) -> bool:
    """An advert of a model served now: a slice or the whole model, loaded (not still arriving)."""
    return isinstance(m, Mapping) and "sha256" in m and not m.get("loading") and ("start" in m or m.get("whole") is True)


def _holder(snap: Any, m: dict[str, Any], measured: float | None) -> Holder | None:
    """The Holder a peer's advert of this model makes: a slice [start, end), or the whole model
    ([0, n_layers), `whole`; its ms/layer = ms per token / n_layers) unless it paused contributing.
    `measured` (this coordinator's EWMA of the peer's ms/layer) wins over advertised figures."""
    transport, rtt = snap.transport or "direct", snap.rtt_ms or 0.0
    if m.get("loading"):
        return None  # its layers are still arriving: counted by layer choices, never routed to
    if "start" in m:
        start, end = m["start"], m.get("end")
        if not (is_int(start) and is_int(end) and 0 <= start < end):
            return None
        return Holder(snap.node_id, start, end, transport, rtt,
                      measured if measured is not None else sane_ms(m.get("ms_per_layer"), None), snap.region)
    if m.get("whole") is not True or m.get("paused"):
        return None
    n_layers = m.get("n_layers")
    if not (is_int(n_layers) and n_layers > 0):
        return None
    advertised = sane_ms(m.get("ms_per_token"), None)
    per_layer = measured if measured is not None else (advertised / n_layers if advertised is not None else None)
    return Holder(snap.node_id, 0, n_layers, transport, rtt, per_layer, snap.region, whole=True)



LEFT_OUT_SAID_MAX = 256  # requests whose left-out nodes are remembered (the log line's once-per-request)


class LayerHolders:
    """The planner's view of the swarm: this node's slices and its connected peers' adverts."""

    def __init__(self, node_id: str, host: SliceHost, peers: Any | None, transport: PipelineTransport,
                 perf: PeerPerformance, region: str | None = None):
        self.node_id = node_id
        self.region = region  # this node's (config.region), as its HELLO says it: its own segments' region
        self.host = host
        self.peers = peers  # PeerManager: peers() snapshots; None without a peer network
        self.transport = transport
        self.perf = perf
        # peers whose link dropped: node id -> (monotonic time this node saw the drop, the peer's
        # last_seen then, models it held then), so that once it links again, until it advertises
        # them loaded, a request waits for it (regain)
        self._gone: dict[str, tuple[float, float, frozenset[str]]] = {}
        # the nodes each recent request was told it leaves out as too old, so a request waiting for a
        # lost holder (a plan every regain poll) says it once, not 5 times a second (review r67)
        self._left_out_said: OrderedDict[str, frozenset[str]] = OrderedDict()

    def _say_left_out(self, request_id: str, nodes: frozenset[str]) -> bool:
        """Whether this request has not yet been told it leaves out these nodes (remembered for the
        last LEFT_OUT_SAID_MAX requests)."""
        if self._left_out_said.get(request_id) == nodes:
            return False
        self._left_out_said[request_id] = nodes
        self._left_out_said.move_to_end(request_id)
        while len(self._left_out_said) > LEFT_OUT_SAID_MAX:
            self._left_out_said.popitem(last=False)
        return True

    def note_peer(self, kind: str, snap: Any) -> None:
        """Peer observer (the coordinator's): remember what a peer whose link dropped held. A
        restarted `--serve auto` node links again with a HELLO offering nothing, then chooses and
        loads its layers (seconds): in that window it is linked, so it was not waited for, and a
        request arriving then failed at once with a 503 while one arriving a moment earlier, with
        the peer away, waited and was served (a churn test, 2026-12-06)."""
        if kind != "removed" and snap.state == "connected":
            return
        now = time.monotonic()
        if len(self._gone) >= const.ROUTE_GONE_MAX:  # peers come and go for weeks: the expired ones go
            self._gone = {n: g for n, g in self._gone.items() if now - g[0] < const.ROUTE_REGAIN_S}
        held = frozenset(m["sha256"] for m in snap.models if _serves(m) and isinstance(m["sha256"], str))
        if held and snap.last_seen is not None:
            # timed from when this node saw the link drop (a later snapshot of the same drop, same
            # last_seen, keeps it), on the monotonic clock (2026-12-06): from the peer's unix
            # last_seen, a wall clock stepped back kept a gone peer awaited for as long as the step,
            # and a coordinator that had itself slept (a closed lid) counted its own sleep against
            # the peer: a request right after wake got a 503 while the peer relinked 30 ms later
            prev = self._gone.get(snap.node_id)
            dropped = prev[0] if prev is not None and prev[1] == snap.last_seen else now
            self._gone[snap.node_id] = (dropped, snap.last_seen, held)

    def _held_lately(self, node_id: str, sha256: str, now: float) -> bool:
        """The peer held this model when its link dropped, within ROUTE_REGAIN_S (note_peer);
        `now` is time.monotonic()."""
        gone = self._gone.get(node_id)
        return gone is not None and now - gone[0] < const.ROUTE_REGAIN_S and sha256 in gone[2]

    def holders(self, sha256: str) -> list[Holder]:
        """Every node that can run a range of this model now: our slices first, then peers'. One
        with no speed figure yet (ours measured, or advertised) is taken to be as fast as the
        median of those with one: at the planner's flat default (2 ms/layer) an unmeasured holder
        lost every request to a measured one, so it was never used, so never measured (a swarm
        test, 2026-12-06); once it runs, its own figure replaces the guess."""
        out = self._holders(sha256)
        figures = sorted(h.ms_per_layer for h in out if sane_ms(h.ms_per_layer, None) is not None)
        if figures and len(figures) < len(out):
            typical = figures[len(figures) // 2]
            out = [h if sane_ms(h.ms_per_layer, None) is not None else dataclasses.replace(h, ms_per_layer=typical)
                   for h in out]
        return out

    def _holders(self, sha256: str) -> list[Holder]:
        out = [Holder(self.node_id, s.start, s.end, "local", 0.0, s.ms_per_layer, self.region)
               for s in self.host.for_model(sha256)
               if not s.checking and not s.entry.changed]  # (as adverts(): review r40, its own requests went there)
        if self.peers is None:
            return out
        for snap in self.peers.peers():
            if snap.state != "connected":
                continue
            measured = self.perf.ms_per_layer(snap.node_id)
            for m in snap.models:
                if m.get("sha256") != sha256:
                    continue
                try:
                    holder = _holder(snap, m, measured)
                except (KeyError, TypeError, ValueError):
                    log.debug("DIAG: unusable model advert skipped %s", kv(peer=snap.node_id[:8], advert=str(m)[:120]))
                    continue
                if holder is not None:
                    out.append(holder)
        return out

    def connection_ids(self, nodes: set[str]) -> dict[str, int | None]:
        """The connection id of each peer's live link now (None: no link, or this node)."""
        if self.peers is None:
            return {}
        out = {}
        for node in nodes:
            snap = self.peers.peer(node)
            out[node] = snap.connection_id if snap is not None else None
        return out

    def regain(self, sha256: str, lost: Mapping[str, int | None],
               silent: Mapping[str, float] | None = None) -> tuple[set[str], list[str]]:
        """For a request with no route: (the nodes of `lost` linked again since — a connection
        other than the one the request lost —, the peers worth waiting for: those of `lost` not
        linked again, and those whose link dropped within ROUTE_REGAIN_S while they served this
        model (`note_peer`) that are not linked yet (being dialled) or linked but not serving it
        yet (choosing or loading their layers), and those linked in the table with no live link (closing:
        of `lost`, or serving this model; `assemble` plans on none such)), both as node ids. A node of `silent` (monotonic
        time it failed the request by silence) still on the link it had is awaited while nothing came
        on that link since: a dead link the pings have not found dead yet (2026-12-06: a Wi-Fi
        blip ended the stream at the first missed ACK); a peer that speaks again is slow, not gone."""
        relinked: set[str] = set()
        awaited: list[str] = []
        if self.peers is None:
            return relinked, awaited
        now = time.monotonic()
        for snap in self.peers.peers():
            if snap.state == "refused":
                continue
            lately = self._held_lately(snap.node_id, sha256, now)
            if snap.state == "connected":
                if snap.node_id in lost and snap.connection_id != lost[snap.node_id]:
                    relinked.add(snap.node_id)
                elif snap.node_id in (silent or {}) and self._silent_since(snap.node_id, silent[snap.node_id]):
                    awaited.append(snap.node_id)
                elif ((snap.node_id in lost or any(_serves(m) and m["sha256"] == sha256 for m in snap.models))
                      and self.peers.link(snap.node_id) is None):
                    # its link is closing (the table says so a loop pass later): awaited like a
                    # dropped one, not a 503 at once (2026-12-07: right after this node's pause);
                    # `assemble` plans on none such, lost by this request or not
                    awaited.append(snap.node_id)
                # back, but not serving it yet (a restarted node choosing or loading its layers)
                if lately and not any(_serves(m) and m["sha256"] == sha256 for m in snap.models):
                    awaited.append(snap.node_id)
            elif snap.node_id in lost or lately:
                awaited.append(snap.node_id)
        return relinked, awaited

    def _linked(self, node_id: str) -> bool:
        """This node, or a peer with a live link to send on."""
        return node_id == self.node_id or (self.peers is not None and self.peers.link(node_id) is not None)

    def _silent_since(self, node_id: str, since: float) -> bool:
        """Nothing came from the peer since `since` (time.monotonic()) on its link now (monotonic,
        so a wall clock set on wake changes nothing)."""
        link = self.peers.link(node_id)
        return link is None or link.last_seen <= since

    def swarm_models(self) -> dict[str, dict[str, Any]]:
        """Models (by sha256) whose layers are fully covered by this node and its peers."""
        found: dict[str, dict[str, Any]] = {}
        adverts = [(self.node_id, a) for a in self.host.adverts()]
        if self.peers is not None:
            adverts += [(s.node_id, m) for s in self.peers.peers() if s.state == "connected" for m in s.models]
        for _, m in adverts:
            sha = m.get("sha256")
            if sha and ("start" in m or (m.get("whole") is True and not m.get("paused"))):
                n_layers = m.get("n_layers")
                if type(n_layers) is int and n_layers > 0:  # a peer's malformed advert names nothing
                    found.setdefault(sha, {"name": m.get("name"), "n_layers": n_layers})
        return {sha: info for sha, info in found.items()
                if self.covers(sha, info["n_layers"])}

    def covers(self, sha256: str, n_layers: int) -> bool:
        """Whether some chain of today's holders spans the model's n_layers."""
        try:
            plan_route(n_layers, self.holders(sha256), standbys=False)
        except InsufficientCapacity:
            return False
        return True

    def _lacks_generate(self, node_id: str) -> bool:
        lacks = getattr(self.peers, "lacks", None)  # (None: no peer network, or a stand-in table)
        return lacks is not None and lacks.lacks(node_id, FrameType.GENERATE)

    def _outdated(self, holders: list[Holder], needs: frozenset[str]) -> dict[str, tuple[str | None, str]]:
        """The peers among `holders` whose HELLO does not list a sampling feature the request uses
        (`needs`: SamplingParams.features; a HELLO listing none is a version before 2026-12-07,
        sampling.OLD_FEATURES): node id -> (the parameter, its words)."""
        out: dict[str, tuple[str | None, str]] = {}
        if not needs or self.peers is None:
            return out
        for node in dict.fromkeys(h.node_id for h in holders if h.node_id != self.node_id):
            snap = self.peers.peer(node)
            missing = lacking(needs, getattr(snap, "sampling", None))
            if missing is not None:
                out[node] = missing
        return out

    @staticmethod
    def _sampling_gap(n_layers: int, holders: list[Holder], outdated: Mapping[str, tuple[str | None, str]],
                      excluded: frozenset[str], exc: InsufficientCapacity) -> InsufficientCapacity:
        """The error for no chain left once the older nodes (`outdated`) were left out of `holders`:
        planned again with them back (the excluded still out), SamplingUnsupportedBySwarm naming
        those of them the chain takes if one is left; else the gap left even with them, which their
        update would not close (review r63: "update node X" though X changed nothing hid "no holder
        has layers 4-7", or a newer holder that failed this request), naming them after it."""
        try:
            plan = plan_route(n_layers, holders, exclude=excluded, standbys=False)
        except InsufficientCapacity as gap:
            nodes = sorted(n for n in outdated if n not in excluded)
            if not nodes:
                return exc
            return InsufficientCapacity(f"{gap.message}; left out of this request as an older version lacking "
                                        f"{outdated[nodes[0]][1]}: {', '.join(n[:8] for n in nodes)}")
        nodes = sorted({h.node_id for h in plan.segments if h.node_id in outdated})
        param, words = outdated[nodes[0]]
        who = f"node {nodes[0][:8]} does" if len(nodes) == 1 else f"nodes {', '.join(n[:8] for n in nodes)} do"
        return SamplingUnsupportedBySwarm(f"{who} not support {words} (its version is older, it does not list "
                                          "it): update it; no other node serving this model can take the request",
                                          param=param)

    def assemble(self, entry: ModelEntry, trace: RequestTrace, attempt_no: int,
                 excluded: frozenset[str], prefer: tuple[tuple[str, int, int], ...] | None = None,
                 load: Mapping[str, int] | None = None, needs: frozenset[str] = frozenset()) -> tuple[Plan, list[str]]:
        """The cheapest chain without the excluded nodes and each segment's transport (local |
        direct | relayed), recorded in the trace (sched_ms, segments, route, regions);
        InsufficientCapacity when no chain is left. A peer with no live link (its link closing while the
        table still says connected) is left out. `prefer`: a kept session's route (its KV holds
        this prompt's prefix), taken instead while it is usable and its estimate is within
        KEPT_ROUTE_MAX_SLOWDOWN of the cheapest (a route that changes between turns reuses nothing).
        `load`: this coordinator's requests under way per node; each makes a holder's ms/layer
        CHAIN_LOAD_WEIGHT dearer, so holders no slower share concurrent requests (every request
        took the same chain while as good holders sat idle: a swarm test, 2026-12-06). `needs`: the
        request's sampling features; a peer not listing one of them in its HELLO is left out before
        any work is sent (every node of a chain gets the sampling dict, and one of a version before
        2026-12-07 ignores a field it lacks, or drops it mid-chain: 2026-12-07); with no chain left
        then, SamplingUnsupportedBySwarm names the field and those of them a chain would take, when
        one is left with them back (else the InsufficientCapacity naming the real gap)."""
        started = trace.begin_assembly()
        outdated: dict[str, tuple[str | None, str]] = {}
        current: list[Holder] = []
        try:
            # a peer the table says connected with no link (closing: the table says so a loop pass
            # later) is no holder: a send to it fails at once, one of MAX_ASSEMBLIES attempts burnt
            # (2026-12-07: the peer of a failure excused by this node's own pause); `regain` awaits it
            holders = [h for h in self.holders(entry.sha256) if self._linked(h.node_id)]
            # a whole holder that refused GENERATE as unknown (a version before remote generate,
            # 2026-12-02; PeerLacks) is asked for none until it restarts (2026-12-07: each request
            # sent it GENERATE and waited out GENERATE_SILENCE_S)
            old = {h.node_id for h in holders if h.whole and self._lacks_generate(h.node_id)}
            holders = [h for h in holders if not (h.whole and h.node_id in old)]
            outdated = self._outdated(holders, needs)
            if outdated:
                current, holders = holders, [h for h in holders if h.node_id not in outdated]
                if self._say_left_out(trace.request_id, frozenset(outdated)):
                    log.info("DIAG: pipeline left out nodes that cannot sample this request (an older version) %s", kv(
                        request_id=trace.request_id, attempt=attempt_no, nodes=",".join(n[:8] for n in outdated),
                        lacks=next(iter(outdated.values()))[0]))
            if load:
                holders = [dataclasses.replace(h, ms_per_layer=h.layer_ms() * (1 + const.CHAIN_LOAD_WEIGHT * load[h.node_id]))
                           if load.get(h.node_id) else h for h in holders]
            plan = plan_route(entry.n_layers, holders, exclude=excluded)
        except InsufficientCapacity as exc:
            trace.end_assembly(started)
            if outdated:  # (the older nodes named only where their update would give a chain)
                err = self._sampling_gap(entry.n_layers, current, outdated, excluded, exc)
                if isinstance(err, SamplingUnsupportedBySwarm):
                    raise err from exc
                exc = err
            if old and not old <= excluded:
                raise InsufficientCapacity(
                    f"{exc.message}; the peers holding model {entry.id} whole ({', '.join(sorted(n[:8] for n in old))}) "
                    "run a version without remote generation: update them, or load the model on this node") from exc
            raise exc
        if prefer is not None and tuple((h.node_id, h.start, h.end) for h in plan.segments) != prefer:
            kept = plan_kept_route(entry.n_layers, holders, prefer, exclude=excluded)
            usable = kept is not None and kept.est_ms <= plan.est_ms * const.KEPT_ROUTE_MAX_SLOWDOWN
            log.info("DIAG: pipeline route %s %s", "kept for its cached prefix" if usable else "changed, cache lost",
                     kv(request_id=trace.request_id, kept_route=",".join(f"{n[:8]}[{a}-{b - 1}]" for n, a, b in prefer),
                        kept_est_ms_per_token=round(kept.est_ms, 2) if kept is not None else "unusable",
                        cheapest=plan.describe(), cheapest_est_ms_per_token=round(plan.est_ms, 2)))
            if usable:
                plan = kept
        kinds = [self.transport.kind(h.node_id) for h in plan.segments]
        segments = [SegmentTrace(h.short_id, h.start, h.end, kind) for h, kind in zip(plan.segments, kinds, strict=True)]
        trace.end_assembly(started, segments)
        trace.route = "relayed" if "relayed" in kinds else "distributed"
        # one per segment, as `nodes=` lists them ("-": a node that names none); until 2026-12-07 the
        # named ones only, and never this node's: `nodes=<us>,<peer> regions=TH` put us in TH
        trace.regions = [h.region or "-" for h in plan.segments] if any(h.region for h in plan.segments) else []
        # seed 000 marker (`DIAG: pipeline assembled` with segments, standbys, schedule_ms): DEBUG for a
        # request's first route (its summary line names the nodes), INFO for a failover's new one
        log.log(logging.INFO if attempt_no > 1 else logging.DEBUG, "DIAG: pipeline assembled %s", kv(
            request_id=trace.request_id, attempt=attempt_no, segments=plan.describe(), standbys=plan.describe_standbys(),
            est_ms_per_token=round(plan.est_ms, 2), schedule_ms=round((time.monotonic() - started) * 1000, 2)))
        return plan, kinds
