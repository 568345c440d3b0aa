"""The batch engine's sequences: which llama.cpp sequence (slot) a request runs in, the prefix
cache the idle ones hold, and the moves that keep the running ones on consecutive ids.

A slot is llama.cpp's KV stream of one sequence id; `Slot.tokens` is what that stream holds,
positions 0.. (every change to one goes with the matching llama_memory_* call, so the two never
part). Idle slots keep the tokens of the last request they ran as a cached prefix; at most
`capacity` slots hold tokens at once, running or cached (the rest, the spare, stays empty so a
move never evicts). Everything here runs on the batch loop's thread.

- `choose(prompt, ...)`: the slot for a new request and how many cached tokens it keeps (prefix
  HIT, a copied shared beginning, or a MISS with its reason; LRU eviction) — seed 000's lines.
- `compact(running)`: the running slots moved onto consecutive ids (see batch_engine's docstring
  for why: llama.cpp computes a batch in one pass only over consecutive ids in order).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from node.inference.speculate import common_prefix
from node.logs import kv

log = logging.getLogger(__name__)

# a prompt sharing at least this many tokens with a cached sequence it does not continue (the same
# system prompt or chat-template preamble, another conversation) starts from a copy of that
# sequence's KV. llama.cpp copies a stream whole, lazily, in the next decode: measured on the 110M
# bench model (AMD EPYC, 2 threads) 0.85 ms per 512-cell stream, 6.4 ms per 4096-cell one, against
# 1.8 ms per prefilled token, so a few shared tokens already pay for the copy (llama-server reuses
# any common prefix of the slot it picks). A copied KV is not the same bits as the prompt
# prefilled whole (llama.cpp's kernels depend on the batch's shape), which moves a sampled
# request's draws: its text for a seed would depend on what the cache held. So short copies are
# for greedy requests (whose text changes only at a near-tie); sampled ones copy from 16 tokens
# (a real system prompt, where the saving is worth it), as before.
COPY_MIN_TOKENS = 4
COPY_MIN_TOKENS_SAMPLED = 16


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what the KV holds for this sequence, positions 0..
    last_used: float = 0.0
    busy: bool = False


class KvSlots:
    """The slots of one llama.cpp context (see the module docstring)."""

    def __init__(self, llama_cpp, mem, *, model_id: str, n_slots: int, capacity: int):
        self.ll = llama_cpp
        self.mem = mem
        self.model_id = model_id
        self.slots = [Slot(i) for i in range(n_slots)]
        self.capacity = capacity  # slots holding tokens at once, running and cached (the rest: the spare)
        self.evictions = 0
        self.moves = 0  # streams copied to another id by `compact`

    def choose(self, prompt: list[int], request_id: str, copy_min: int = COPY_MIN_TOKENS,
               running: tuple[Slot, ...] = ()) -> tuple[Slot, int]:
        """The slot for a prompt and how many of its cached tokens it keeps (at most all but the
        prompt's last token: its logits are needed). `running`: busy slots it may start from a copy
        of (another choice of the same request, its prompt prefilled: OpenAI's `n`)."""
        free = [s for s in self.slots if not s.busy]
        limit = len(prompt) - 1
        best, best_n = None, 0
        for slot in free:
            n = min(common_prefix(slot.tokens, prompt), limit)
            if n > best_n:
                best, best_n = slot, n
        if best is not None and best_n * 2 >= len(best.tokens):  # it extends (most of) a cached sequence
            log.debug("DIAG: KV-cache HIT — skipping prefill %s", kv(
                request_id=request_id, start_pos=best_n, cached_tokens=best_n, seq=best.seq_id,
                new_prompt_len=len(prompt)))
            return best, best_n
        empty = [s for s in free if not s.tokens]
        held = sum(1 for s in self.slots if s.busy or s.tokens)
        if empty and held < self.capacity:  # the last empty slot is the spare: never filled
            slot, n = empty[0], 0
        else:
            slot = min((s for s in free if s.tokens), key=lambda s: s.last_used)
            n = min(common_prefix(slot.tokens, prompt), limit)
            self._evicted(slot, "lru", kept_tokens=n)
        for other in running:  # a sibling's prefilled prompt beats any cached beginning
            shared = min(common_prefix(other.tokens, prompt), limit)
            if shared > n and (best is None or best is slot or shared > best_n):
                best, best_n = other, shared
        if best is not None and best is not slot and best_n > n and best_n >= copy_min:
            # a shared beginning (a system prompt) of a sequence that stays cached, or the prompt of a
            # sibling choice: copy its KV stream (llama.cpp copies streams whole), the tail is cut by
            # the caller
            self.ll.llama_memory_seq_cp(self.mem, best.seq_id, slot.seq_id, -1, -1)
            slot.tokens = list(best.tokens)
            n = best_n
            log.debug("DIAG: KV-cache HIT — skipping prefill %s", kv(
                request_id=request_id, start_pos=n, cached_tokens=n, seq=slot.seq_id, copied_from=best.seq_id,
                new_prompt_len=len(prompt)))
        elif n > 0:
            log.debug("DIAG: KV-cache HIT — skipping prefill %s", kv(
                request_id=request_id, start_pos=n, cached_tokens=n, seq=slot.seq_id, new_prompt_len=len(prompt)))
        elif best is not None:
            log.debug("DIAG: KV-cache MISS — prompt prefix mismatch %s", kv(
                request_id=request_id, reason="prefix_mismatch", cached_prompt_len=len(best.tokens),
                common_tokens=best_n, new_prompt_len=len(prompt)))
        else:
            cached = sum(1 for s in self.slots if s.tokens)
            log.debug("DIAG: KV-cache MISS — no cached prefix %s", kv(
                request_id=request_id, reason="no_cached_prefix" if cached else "cache_empty",
                cached_sequences=cached, new_prompt_len=len(prompt)))
        return slot, n

    def compact(self, running: list[Slot]) -> dict[int, Slot]:
        """Move the running slots onto consecutive ids: the window of ids that needs the fewest
        stream copies, its holes filled by the running slots outside it, empty holes first. A
        hole's cached prefix moves to an empty slot outside the window (one exists: the spare, or
        the slot a mover has just left), or, when the mover has nothing in its KV yet (admitted
        this step), into the mover's own slot. Returns {old seq id: new slot} for those that moved."""
        ids = sorted(slot.seq_id for slot in running)
        k = len(ids)
        if not k or ids[-1] - ids[0] + 1 == k:
            return {}
        by_id = {slot.seq_id: slot for slot in running}

        def cost(a: int) -> int:
            movers = [by_id[i] for i in ids if not a <= i < a + k]
            holes = [i for i in range(a, a + k) if i not in by_id]
            return sum(1 for m in movers if m.tokens) + sum(1 for i in holes if self.slots[i].tokens)

        a = min(range(len(self.slots) - k + 1), key=cost)
        window = range(a, a + k)
        movers = [by_id[i] for i in ids if i not in window]
        holes = sorted((i for i in window if i not in by_id), key=lambda i: bool(self.slots[i].tokens))
        moved: dict[int, Slot] = {}
        for src, hole in zip(movers, holes, strict=True):
            dst = self.slots[hole]
            moving = bool(src.tokens)
            if dst.tokens and not moving:  # trade places: the cached prefix into the mover's slot
                self._move(dst, src)
            elif dst.tokens:
                park = next((s for s in self.slots if not s.busy and not s.tokens and s.seq_id not in window), None)
                if park is None:  # no spare (the running sequences fill the KV budget): evict
                    park = min((s for s in self.slots if not s.busy and s.tokens and (s.seq_id not in window or s is dst)),
                               key=lambda s: s.last_used)  # the hole's own prefix too: then it goes
                    self._evicted(park, "lru_compaction")
                    self.ll.llama_memory_seq_rm(self.mem, park.seq_id, -1, -1)
                    park.tokens = []
                if park is not dst:
                    self._move(dst, park)
            if moving:
                self._move(src, dst)
            src.busy, dst.busy = False, True
            moved[src.seq_id] = dst
        log.debug("DIAG: batch sequences moved %s", kv(model=self.model_id, running=k, first_seq=a,
                                                        moved=len(movers), moves=self.moves))
        return moved

    def _evicted(self, slot: Slot, reason: str, **extra) -> None:
        self.evictions += 1
        # DEBUG: once the cache is full every new conversation evicts one, a line per request at INFO
        # (DEBUG, as the KV-cache HIT/MISS lines: at INFO a full cache logged it once per request)
        log.debug("DIAG: KV-cache sequence evicted %s", kv(
            reason=reason, seq=slot.seq_id, cached_tokens=len(slot.tokens), **extra,
            idle_s=round(time.monotonic() - slot.last_used, 1), evictions=self.evictions))

    def _move(self, src: Slot, dst: Slot) -> None:
        """Copy src's KV stream and tokens to dst (whose own are dropped); src is left empty. The
        copy is llama.cpp's, done at the next decode, in the order asked."""
        self.ll.llama_memory_seq_cp(self.mem, src.seq_id, dst.seq_id, -1, -1)
        self.ll.llama_memory_seq_rm(self.mem, src.seq_id, -1, -1)
        dst.tokens, src.tokens = src.tokens, []
        dst.last_used = src.last_used
        self.moves += 1

    # --- inspection (tests, diagnostics; any thread, approximate while running) ---

    def kv_tokens(self) -> dict[int, int]:
        """Tokens the KV holds per sequence id, as llama.cpp reports them (pos_max + 1)."""
        return {s.seq_id: int(self.ll.llama_memory_seq_pos_max(self.mem, s.seq_id)) + 1 for s in self.slots}

    def cached_sequences(self) -> int:
        return sum(1 for s in self.slots if s.tokens and not s.busy)
