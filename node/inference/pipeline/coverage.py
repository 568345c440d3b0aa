"""The swarm's coverage of each model, read from peers' HELLO adverts (`swarm_coverage`: what
`--serve auto` chooses from and what diagnostics' `-- swarm coverage --` prints), and what one layer
of a model costs this node (`slice_sizes`, `default_budget_bytes`: the budget's units)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from node import const
from node.inference.pipeline import layerchoice as lc
from node.torch_import import import_torch
from node.values import int_or_none

# --- the swarm's coverage, from adverts ---

@dataclass
class ModelCoverage:
    """Who serves which layers of one model (by sha256), as adverts say."""

    sha256: str
    name: str
    n_layers: int
    spans: list[lc.Span] = field(default_factory=list)
    budgets: dict[str, lc.LayerBudget] = field(default_factory=dict)  # nodes that choose (--serve auto)
    whole: list[str] = field(default_factory=list)  # node ids serving it whole (llama.cpp)
    # spans (also in `spans`: the layer choice counts them) whose layers are still arriving: no
    # planner routes to them, so diagnostics do not count them as held
    loading: list[lc.Span] = field(default_factory=list)
    # bytes of its layers a loading span's node says it has fetched (its advert's `fetch`), by
    # (node, start, end): a claim whose fetch moves is not stale (autoserve.AutoServe.coverage)
    fetched: dict[tuple[str, int, int], int] = field(default_factory=dict)



def _parse_advert(m: Mapping[str, Any]) -> tuple[str, str, int, tuple[int, int] | None, float | None,
                                                  lc.LayerBudget | None] | None:
    """(sha256, name, n_layers, (start, end) or None when whole, ms/layer, budget) of one advert,
    None when malformed (a peer's advert is input: validated, never trusted)."""
    sha, n_layers = m.get("sha256"), int_or_none(m.get("n_layers"))
    if not isinstance(sha, str) or not sha or n_layers is None or not 0 < n_layers <= 100_000:
        return None
    name = m.get("name") if isinstance(m.get("name"), str) else sha[:8]
    if m.get("whole") is True and "start" not in m:
        return sha, name, n_layers, None, None, None
    start, end = int_or_none(m.get("start")), int_or_none(m.get("end"))
    if start is None or end is None or not 0 <= start < end <= n_layers:
        return None
    ms = m.get("ms_per_layer")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
        ms = None
    budget = None
    raw = m.get("auto_budget")
    if isinstance(raw, list) and len(raw) == 2 and all(int_or_none(v) is not None and 0 <= v <= n_layers for v in raw):
        budget = lc.LayerBudget(raw[0], raw[1])
    return sha, name, n_layers, (start, end), float(ms) if ms is not None else None, budget


def _fetch_done(m: Mapping[str, Any]) -> int | None:
    """Bytes fetched of a loading advert's `fetch: [done, total]`, None when absent or malformed."""
    raw = m.get("fetch")
    if not isinstance(raw, list) or len(raw) != 2:
        return None
    done, total = int_or_none(raw[0]), int_or_none(raw[1])
    return done if done is not None and total is not None and 0 <= done <= total else None


def swarm_coverage(node_id: str, own_adverts: Iterable[Mapping[str, Any]],
                   peers: Iterable[Any]) -> dict[str, ModelCoverage]:
    """Per model: this node's adverts and every connected peer's (malformed ones skipped). A hash
    advertised with different layer counts is believed at this node's own count if it holds the
    model, else at the count most holders advertise (one peer's wrong count cannot hide the rest)."""
    out: dict[str, ModelCoverage] = {}
    sources = [(node_id, m) for m in own_adverts]
    sources += [(p.node_id, m) for p in peers if p.state == "connected" for m in p.models]
    parsed_all = []
    votes: dict[str, dict[int, set[str]]] = {}
    own: dict[str, int] = {}
    for holder, m in sources:
        parsed = _parse_advert(m) if isinstance(m, Mapping) else None
        if parsed is None:
            continue
        loading = m.get("loading") is True
        parsed_all.append((holder, parsed, loading, _fetch_done(m) if loading else None))
        sha, n_layers = parsed[0], parsed[2]
        votes.setdefault(sha, {}).setdefault(n_layers, set()).add(holder)
        if holder == node_id:
            own.setdefault(sha, n_layers)
    believed = {sha: own.get(sha) or max(counts, key=lambda n: (len(counts[n]), -n)) for sha, counts in votes.items()}
    for holder, (sha, name, n_layers, span, ms, budget), loading, fetched in parsed_all:
        if n_layers != believed[sha]:
            continue  # disagrees with what the model is believed to have: not believed
        cov = out.setdefault(sha, ModelCoverage(sha, name, n_layers))
        if span is None:
            cov.whole.append(holder)
            continue
        cov.spans.append(lc.Span(holder, span[0], span[1], ms))
        if loading:
            cov.loading.append(cov.spans[-1])
            if fetched is not None:
                cov.fetched[(holder, span[0], span[1])] = fetched
        if budget is not None:
            cov.budgets[holder] = budget
    return out


def paused_holders(peers: Iterable[Any], sha256: str) -> set[str]:
    """The connected peers whose advert of this model says `paused` (contributing off: they refuse
    GENERATE and MODEL_PART for its whole file), though swarm_coverage counts them in `whole`."""
    return {p.node_id for p in peers if p.state == "connected" for m in p.models
            if isinstance(m, Mapping) and m.get("sha256") == sha256 and m.get("paused") is True}


def coverage_text(n_layers: int, spans: Sequence[lc.Span]) -> str:
    """Holders per layer, run-length: `2x4,1x4` = four layers with two holders, then four with one."""
    counts = [int(c) for c in lc.layer_counts(n_layers, spans)]
    runs: list[list[int]] = []
    for c in counts:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return ",".join(f"{c}x{n}" for c, n in runs) or "-"


# --- the budget ---

@dataclass(frozen=True)
class SliceSizes:
    """Bytes one layer of a model costs at the slice dtype, its KV reserve, and the output head."""

    per_layer_bytes: int
    kv_per_layer_bytes: int
    head_bytes: int
    n_layers: int


def slice_sizes(path: Any, dtype: str, max_ctx: int = 0, *, header_of_size: int | None = None,
                kv_dtype: str = "auto") -> SliceSizes:
    """From tensor shapes only (blocking: opens the file; run it in an executor). `header_of_size`:
    `path` is only the header of a file that large (a model known here by its header); `kv_dtype`:
    the slices' KV cache type (SliceModel.load's)."""
    torch = import_torch()
    from node.inference.arch import family
    from node.inference.slice.formats import kv_element_bytes, resolve_format
    from node.inference.slice.model import estimate_bytes
    from node.inference.weights.gguf_file import GgufFile

    f = GgufFile(path, header_of_size=header_of_size)
    cfg = family(f.arch).config(f)
    fmt = resolve_format(dtype, torch.device("cpu"))
    n = cfg.n_layers
    head = estimate_bytes(path, n, n, fmt, header_of_size=header_of_size)  # no blocks: the output norm and head only
    layers = estimate_bytes(path, 0, n, fmt, header_of_size=header_of_size) - head
    ctx = max_ctx or cfg.n_ctx_train
    kv_bytes = 2 * cfg.kv_dim * ctx * kv_element_bytes(kv_dtype)  # K and V at the slices' KV dtype on the CPU
    return SliceSizes(-(-layers // n), kv_bytes, head, n)


def default_budget_bytes() -> int:
    """Free memory minus headroom (blocking: reads the OS)."""
    import psutil

    return max(0, psutil.virtual_memory().available - const.AUTO_SERVE_HEADROOM_MB * 2**20)
