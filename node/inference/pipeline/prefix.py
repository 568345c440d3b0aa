"""Prefix KV reuse on a chain: which finished sessions the segments keep for this coordinator.

A chat app re-sends the whole conversation every turn. When a run on a chain ends normally, the
coordinator asks every segment to keep the session's KV (SESSION_END with `keep`) and remembers
here the tokens it holds (prompt + generated, less the last sampled token, which was never fed)
and the route. A later request whose prompt extends those tokens on the same route resumes it:
its first WORK names the kept session (`resume`) and starts at the common prefix, which every
segment cuts its KV to. Seed 000's lines say which: `DIAG: KV-cache HIT — skipping prefill` or
`DIAG: KV-cache MISS — ...` with the reason.

A kept session is consumed by the request that resumes it (its KV becomes that request's), so two
requests never write into one. A prompt that shares less than half of a kept session's tokens (but
at least CHAIN_PREFIX_MIN_TOKENS: another conversation with the same system prompt) copies that
prefix instead (`resume_copy`): each segment makes a new session holding a copy of those positions
and the kept one stays kept, whole, for its own conversation's next turn. At most `max_per_model` are kept per model (LRU; the evicted ones
are freed on their segments); the segments themselves evict kept sessions first when over their
KV budget and after KEPT_SESSION_TTL_S idle, and a resume that finds it gone fails with `kv_miss`:
the run then prefills in full on a fresh session (PipelineRun).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from node import const
from node.inference.pipeline.wire import Hop
from node.inference.speculate import common_prefix
from node.logs import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeptChain:
    """A finished session kept on every segment of `route`, holding the KV of `tokens`."""

    sid: str
    model: str
    route: tuple[Hop, ...]
    tokens: tuple[int, ...]
    kept_at: float

    def nodes(self) -> set[str]:
        return {h.node_id for h in self.route}


@dataclass
class PrefixStats:
    hits: int = 0
    misses: int = 0
    cached_tokens: int = 0  # prompt tokens not prefilled thanks to hits
    evictions: int = 0  # LRU evictions here (the segments log their own)
    gone_on_segment: int = 0  # misses: taken here, but a segment had evicted it (kv_miss)
    copies: int = 0  # hits that copied a kept session's prefix (a shared system prompt)


class ChainPrefixCache:
    """The kept sessions of this coordinator's chains, oldest-used first."""

    def __init__(self, max_per_model: int):
        self.max_per_model = max_per_model  # 0: off
        self.entries: OrderedDict[str, KeptChain] = OrderedDict()  # sid -> kept chain
        self.stats = PrefixStats()

    def __len__(self) -> int:
        return len(self.entries)

    def route_for(self, model: str, prompt: list[int]) -> tuple[tuple[str, int, int], ...] | None:
        """The route of the kept session this prompt would resume or copy from (the planner prefers
        it), or None when none shares CHAIN_PREFIX_MIN_TOKENS with it (take()'s rule)."""
        if self.max_per_model <= 0:
            return None
        limit = len(prompt) - 1
        now = time.monotonic()
        scored = [(min(common_prefix(e.tokens, prompt), limit), e) for e in self.entries.values()
                  if e.model == model and now - e.kept_at <= const.KEPT_SESSION_TTL_S]
        n, best = max(scored, key=lambda x: x[0], default=(0, None))
        if best is None or n < const.CHAIN_PREFIX_MIN_TOKENS:
            return None
        return tuple((h.node_id, h.start, h.end) for h in best.route)

    def take(self, model: str, route: tuple[Hop, ...], prompt: list[int],
             request_id: str) -> tuple[KeptChain | None, int, bool]:
        """The kept session this prompt should start from on `route`, how many of its tokens it
        keeps (at most all but the prompt's last: its logits are needed) and whether as a copy:
        a prompt extending at least half of the kept tokens resumes it (removed from the cache),
        one sharing less (a system prompt) copies that prefix and the entry stays (just used);
        (None, 0, False) on a miss. Logs HIT or MISS with the reason."""
        if self.max_per_model <= 0:
            return None, 0, False
        now = time.monotonic()
        for sid in [sid for sid, e in self.entries.items() if now - e.kept_at > const.KEPT_SESSION_TTL_S]:
            del self.entries[sid]  # the segments have evicted them by now
        candidates = [e for e in self.entries.values() if e.model == model]
        limit = len(prompt) - 1
        scored = [(min(common_prefix(e.tokens, prompt), limit), e) for e in candidates]
        same_route = [(n, e) for n, e in scored if e.route == route]
        n, best = max(same_route, key=lambda x: x[0], default=(0, None))
        if best is not None and n >= const.CHAIN_PREFIX_MIN_TOKENS:
            copy = n * 2 < len(best.tokens)
            if copy:
                self.entries[best.sid] = replace(best, kept_at=time.monotonic())
                self.entries.move_to_end(best.sid)
                self.stats.copies += 1
            else:
                del self.entries[best.sid]
            self.stats.hits += 1
            self.stats.cached_tokens += n
            log.debug("DIAG: KV-cache HIT — skipping prefill %s", kv(
                request_id=request_id, start_pos=n, cached_tokens=n, kept=best.sid, new_prompt_len=len(prompt),
                route="chain", **({"copied_from": best.sid} if copy else {})))
            return best, n, copy
        self.stats.misses += 1
        other_n, other = max(((n, e) for n, e in scored if e.route != route), key=lambda x: x[0], default=(0, None))
        if other is not None and other_n >= const.CHAIN_PREFIX_MIN_TOKENS:
            log.debug("DIAG: KV-cache MISS — cached prefix is on another chain %s", kv(
                request_id=request_id, reason="route_changed", common_tokens=other_n, new_prompt_len=len(prompt)))
        elif scored:
            best_n, e = max(scored, key=lambda x: x[0])
            log.debug("DIAG: KV-cache MISS — prompt prefix mismatch %s", kv(
                request_id=request_id, reason="prefix_mismatch", cached_prompt_len=len(e.tokens),
                common_tokens=best_n, new_prompt_len=len(prompt)))
        else:
            log.debug("DIAG: KV-cache MISS — no cached prefix %s", kv(
                request_id=request_id, reason="no_cached_prefix" if self.entries else "cache_empty",
                cached_sequences=len(self.entries), new_prompt_len=len(prompt)))
        return None, 0, False

    def missed_on_segment(self, cached: int, copied_from: str | None = None,
                          source_gone: bool = True) -> KeptChain | None:
        """A hit whose kept session a segment no longer held: the request prefilled in full.
        `copied_from`: the hit was a copy of that entry, still in the cache: forgotten when
        `source_gone`, and returned to be freed elsewhere."""
        gone = None
        if copied_from is not None:
            self.stats.copies -= 1
            gone = self.entries.pop(copied_from, None) if source_gone else None
        self.stats.hits -= 1
        self.stats.cached_tokens -= cached
        self.stats.misses += 1
        self.stats.gone_on_segment += 1
        return gone

    def put(self, entry: KeptChain) -> list[KeptChain]:
        """Remember a kept session; the ones it pushes out (over max_per_model), to be freed."""
        self.entries[entry.sid] = entry
        same = [e for e in self.entries.values() if e.model == entry.model]
        evicted = same[: max(0, len(same) - self.max_per_model)]
        for e in evicted:
            del self.entries[e.sid]
            self.stats.evictions += 1
            log.debug("DIAG: KV-cache sequence evicted %s", kv(  # per request once full (kv_slots._evicted)
                reason="lru", kept=e.sid, cached_tokens=len(e.tokens), route="chain",
                idle_s=round(time.monotonic() - e.kept_at, 1), evictions=self.stats.evictions))
        return evicted

    def through(self, node_id: str) -> list[KeptChain]:
        """Forget the kept sessions on chains through `node_id` (gone); returned to be freed elsewhere."""
        gone = [e for e in self.entries.values() if node_id in e.nodes()]
        for e in gone:
            del self.entries[e.sid]
        return gone
