"""What a node says about itself: whether it is ready to serve (`/health/ready`) and its counters
(`/api/admin/stats`, the GUI's overview)."""

from __future__ import annotations

import time
from typing import Any

Node = Any  # node.node.Node (not imported: it imports this module)

def node_ready(node: Node) -> bool:
    """True once this node's own models and slices are loaded (and there is something to serve).
    A node that holds nothing is ready once it can serve a model of the swarm (its header here,
    its layers covered by peers). A stopping node is not ready: a balancer sends it nothing more."""
    if node.stopping:
        return False
    if node.autoserve is not None and node.autoserve.chooses_at_start:
        # chosen layers: ready once chosen; a later move does not flap it. A node whose budget
        # fits no layer (or that chose none) is ready once the swarm covers a model it can
        # coordinate: it served chains while /health/ready said 503 for ever (2026-12-06)
        whole_loading = any(m.state == "loading" for m in node.models.whole_models())
        sliced = any(s.state == "loaded" for s in node.slice_host.slices.values())
        swarm = node.pipeline.swarm_models() if node.pipeline is not None else {}
        coordinates = any(not m.whole and m.tokenizer is not None and m.entry.sha256 in swarm
                          for m in node.models.all())
        return node.autoserve.settled and (sliced or node.models.ready or coordinates) and not whole_loading
    # slices the layer choice took (contributions from the app) do not hold readiness back: a node
    # serving its own models stays ready while it fetches layers for the swarm
    loading = any(m.state == "loading" for m in node.models.whole_models()) or \
        any(s.state == "loading" and s.auto_budget is None for s in node.slice_host.slices.values())
    if loading:
        return False
    configured = [s for s in node.slice_host.slices.values() if s.auto_budget is None]
    if node.models.ready or (configured and all(s.state in ("loaded", "draining") for s in configured)) \
            or node.slice_host.ready:
        return True
    holds_nothing = not node.models.whole_models() and not node.slice_host.slices
    return holds_nothing and _serves_from_swarm(node)


def _serves_from_swarm(node: Node) -> bool:
    swarm = node.pipeline.swarm_models() if node.pipeline is not None else {}
    return any(not m.whole and not m.entry.has_file and m.tokenizer is not None and m.entry.sha256 in swarm
               for m in node.models.all())


def node_stats(node: Node) -> dict[str, Any]:
    """Counters for /api/admin/stats and the GUI overview."""
    recent = list(node.traces.recent)
    rates = [t.tok_per_sec for t in recent[-10:] if t.tok_per_sec]
    return {
        "node_id": node.node_id,
        "short_id": node.short_id,
        "version": node.version,
        "uptime_s": round(time.time() - node.started_at, 1) if node.started_at else 0,
        "api_url": node.api_url,
        "requests": dict(node.traces.counts),
        "in_flight": {"traces": node.traces.in_flight, "pipelines": node.pipelines_in_flight()},
        "requests_last_minute": node.traces.finished_since(time.time() - 60),
        "recent_tok_per_sec": round(sum(rates) / len(rates), 1) if rates else None,
        "models_loaded": sum(1 for m in node.models.all() if m.state == "loaded"),
        "peers": sum(1 for p in node.peers.peers() if p.state == "connected") if node.peers is not None else 0,
        "kv_sessions": node.slice_host.session_count(),
        "kv_kept": node.slice_host.kept_count(),  # finished, kept for their conversation's next turn
        "kv_mb": round(node.slice_host.kv_bytes() / 2**20, 3),
        # ended session ids refused to late WORK; session controls dropped past a sender's budget
        "session_tombstones": len(node.worker.ended) if node.worker is not None else 0,
        "session_controls_dropped": node.worker.control_budget.dropped if node.worker is not None else 0,
        "session_control_senders": len(node.worker.control_budget) if node.worker is not None else 0,
        "remote_generations": node.remote_server.in_flight if node.remote_server is not None else 0,
        "loop_stalls": node.watchdog.stalls,
        # this node's own pauses (stalls of SELF_PAUSE_MIN_S or more: SIGSTOP, a lid closed) and the
        # last one's length on the clock that counts a machine's sleep (None: none yet)
        "self_pauses": node.watchdog.pause_count,
        "last_pause_s": round(node.watchdog.pauses[-1][2], 3) if node.watchdog.pauses else None,
    }
