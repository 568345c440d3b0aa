"""Continuous batching for one loaded GGUF model: many requests decoded in one llama.cpp context.

One llama.cpp context holds `n_slots` sequences (llama.cpp's per-sequence KV streams, not the
unified buffer: each sequence owns exactly `n_ctx` cells, so the KV memory is fixed at load,
`n_slots * n_ctx` cells, and no request can crowd another out of the cache). A slot is either
running a request or idle; an idle slot keeps the tokens of the last request it ran (prompt and
reply) as a cached prefix. `max_concurrent` requests run at once; at most `cache_seqs` more
slots hold cached prefixes (LRU), and with `max_concurrent` > 1 one more slot stays empty (the
spare, see below).

Consecutive sequence ids. With per-sequence streams llama.cpp computes a batch in one pass only
over sequences of consecutive ids, rows in increasing id order (llama_batch_allocr::split_equal
with `sequential`: any gap or step back starts another ubatch, another pass over every weight).
Measured on the 110M bench model (AMD EPYC, 2 threads): 8 sequences decode in 15.7 ms as ids
0..7 in order, 29 ms as 0,2,..,14 or shuffled, 3.6-4.4 ms one alone. So before each step the
running sequences are moved onto consecutive ids (`_compact`): a running sequence outside the
window is copied into a hole of it (llama_memory_seq_cp of a whole stream, done by llama.cpp at
the next decode: 0.85 ms per 512-cell stream, 6.4 ms per 4096-cell one, once per move), and a
cached prefix that sat in the hole moves to an empty slot first - the spare guarantees one, so
compaction never evicts (without a spare, when the running sequences fill the KV budget, the
least recently used prefix goes). The batch lists each sequence's rows together, in id order.
The slots themselves, the prefix cache's choice and the moves are `node.inference.kv_slots`.

The loop runs on the model's executor thread while there is work (`submit` starts it; it returns
when nothing is running or waiting, so embeddings and unloads get the thread between bursts).
Every step:
  1. admit waiting requests into free slots: the slot whose cached tokens share the longest
     prefix with the prompt when the prompt continues it (that prefix is kept, only the rest is
     prefilled: `DIAG: KV-cache HIT`), else an empty slot, else the least recently used one
     (`DIAG: KV-cache sequence evicted`), starting from a copy of a cached sequence that shares
     a long enough beginning with the prompt (a system prompt); a request that reuses nothing
     logs `DIAG: KV-cache MISS` with its reason;
  2. drop cancelled requests (their sequence is removed from the KV at once);
  3. move the running sequences onto consecutive ids (see above), then build ONE llama_batch:
     the next token of every decoding sequence, prompt chunks of the prefilling ones (at most
     `prefill_chunk` tokens per step in all, oldest request first, so a long prompt never stalls
     the others' decode for more than one chunk), each sequence's rows together, in id order;
  4. one llama_decode;
  5. sample every sequence whose logits came out: logprobs read the raw row first (a copy, only
     when asked), then logit_bias and the grammar mask are applied in place on llama.cpp's own
     logits row, then the sequence's own sampler chain (penalties, top-k, top-p, min-p,
     temperature, dist with its own seed; greedy at temperature 0) samples from that row.

N-gram speculation (node.inference.speculate, `speculative_max_draft` > 0): a decoding sequence
may add the drafter's tokens after its next token in the same batch, each with logits. Its rows
are then sampled in order, and the draft is kept while the sampled token equals it; the first
disagreement (or the row after the last draft token) gives the round's own token. The sampler
chain only ever sees the tokens that are output (llama_sampler_sample accepts each), and the
rejected positions leave the KV at once (llama_memory_seq_rm), so the slot's tokens always equal
its KV. Greedy text is the text without speculation (up to an exact near-tie: llama.cpp computes
several rows of one sequence with other kernels than one row). Only greedy requests speculate
(speculate.speculation_off_reason): a sampled request's draws would move with those last bits, and
a grammar, a logit_bias or logprobs follow every sampled token.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import logging
import random
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from node.const import PENALTY_LAST_N_TOKENS
from node.errors import EngineError, NodeError
from node.inference import constrain
from node.inference.handoff import GenerationJob, TokenChannel
from node.inference.kv_slots import COPY_MIN_TOKENS, COPY_MIN_TOKENS_SAMPLED, KvSlots, Slot
from node.inference.logprobs import scores_from_logits
from node.inference.speculate import NgramDrafter, accept_count, speculation_off_reason
from node.logs import kv

log = logging.getLogger(__name__)

# flash attention off by default, as llama-cpp-python's Llama has it: a request's numbers do not
# depend on what else is in its batch. With it (NodeConfig.flash_attention: llama-server's "auto")
# several sequences decode faster, but ggml's CPU kernel takes another path for a lone query row
# over >= 512 KV cells (split across threads, then reduced) than for a batch of sequences, so a
# seeded request's text may differ alone and under load (tests/inference/test_speculate.py's
# batched-vs-alone check fails with it on).
FLASH_ATTN_OFF, FLASH_ATTN_AUTO = 0, -1  # LLAMA_FLASH_ATTN_TYPE_DISABLED, _AUTO
YIELD_AFTER_S = 0.1  # steps the loop runs before other work waiting for the thread (embeddings) gets it
PENALTY_LAST_N = PENALTY_LAST_N_TOKENS  # what the repeat/frequency/presence penalties look back on
@dataclass(eq=False)
class _Seq:
    """One request in the batch."""

    job: GenerationJob
    channel: TokenChannel
    is_eog: object
    vocab: object
    future: concurrent.futures.Future
    slot: Slot | None = None
    sampler: object = None
    constraint: constrain.TokenConstraint | None = None
    rest: list[int] = field(default_factory=list)  # prompt tokens still to prefill
    next_token: int | None = None  # sampled, not yet in the KV
    produced: int = 0
    out_index: int = -1  # this step's row in the logits, -1 when it has none
    drafter: NgramDrafter | None = None  # n-gram speculation (None: off for this request)
    draft: list[int] = field(default_factory=list)  # this step's draft tokens, rows out_index + 1 ..


class BatchEngine:
    """The batch loop of one model (see the module docstring). `submit` is thread-safe; everything
    else runs on `executor`'s single thread."""

    def __init__(self, llama_cpp, model, *, model_id: str, n_ctx: int, max_concurrent: int, cache_seqs: int,
                 n_threads: int, executor: concurrent.futures.Executor, n_batch: int = 512,
                 prefill_chunk: int = 256, speculative_max_draft: int = 0, flash_attention: bool = False,
                 spare: bool = True, others_waiting=lambda: False):
        self.ll = llama_cpp
        self.model_id = model_id
        self.n_ctx = n_ctx
        self.max_concurrent = max(1, max_concurrent)
        # the spare: with several running sequences, one slot more than they and the cache can fill,
        # so moving a cached prefix out of a running sequence's way never evicts one (`_compact`)
        self.spare = 1 if self.max_concurrent > 1 and spare else 0
        self.n_slots = min(self.max_concurrent + max(0, cache_seqs) + self.spare,
                           llama_cpp.llama_max_parallel_sequences())
        self.max_concurrent = min(self.max_concurrent, self.n_slots)
        self.capacity = self.n_slots - self.spare  # sequences the KV holds at once, running and cached
        self.n_batch = max(n_batch, self.max_concurrent)
        self.prefill_chunk = max(1, min(prefill_chunk, self.n_batch))
        self.executor = executor
        # True while other work (embeddings, an unload) waits for `executor`'s thread: the loop then
        # lets it run between two steps instead of holding the thread while any request runs
        self.others_waiting = others_waiting
        self.speculative_max_draft = max(0, speculative_max_draft)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * self.n_slots
        params.n_batch = self.n_batch
        params.n_ubatch = self.n_batch
        params.n_seq_max = self.n_slots
        params.kv_unified = False  # one KV stream of n_ctx cells per sequence
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        params.flash_attn_type = FLASH_ATTN_AUTO if flash_attention else FLASH_ATTN_OFF
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise EngineError(f"llama.cpp could not create a context of {self.n_slots} x {n_ctx} tokens")
        self.ctx = ctx
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(ctx)
        if self.n_ctx_seq < n_ctx:
            llama_cpp.llama_free(ctx)
            raise EngineError(f"llama.cpp gave {self.n_ctx_seq} tokens per sequence, {n_ctx} needed")
        self.mem = llama_cpp.llama_get_memory(ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.kv_slots = KvSlots(llama_cpp, self.mem, model_id=model_id, n_slots=self.n_slots, capacity=self.capacity)
        self.slots = self.kv_slots.slots
        self._lock = threading.Lock()
        self._pending: collections.deque[_Seq] = collections.deque()
        self._active: list[_Seq] = []
        self._running = False
        self.ms_per_token: float | None = None  # EWMA of decode steps
        self.steps = 0
        self.max_active_seen = 0
        self.spec_drafted = self.spec_accepted = 0  # totals over requests (tests, diagnostics)
        # the rows' logits as numpy, built only for a request that reads them (a constraint, logprobs)
        self._row_type = ctypes.c_float * self.n_vocab

    # --- any thread ---

    def submit(self, job: GenerationJob, channel: TokenChannel, is_eog, vocab=None) -> concurrent.futures.Future:
        """Queue a generation; its tokens go to `channel`; the future is done when it has ended."""
        seq = _Seq(job, channel, is_eog, vocab, concurrent.futures.Future())
        with self._lock:
            if self.ctx is None:
                raise EngineError(f"model {self.model_id} is not loaded")
            self._pending.append(seq)
            start = not self._running
            self._running = True
        if start:
            self.executor.submit(self._serve)
        return seq.future

    @property
    def active(self) -> int:
        return len(self._active)

    # --- the loop (executor thread) ---

    def _serve(self) -> None:
        since = time.monotonic()
        try:
            while True:
                with self._lock:
                    if not self._pending and not self._active:
                        self._running = False
                        return
                # other work waits for the thread: after a share of steps, go on after it (the
                # executor runs its work in order)
                if self.others_waiting() and time.monotonic() - since >= YIELD_AFTER_S:
                    self.executor.submit(self._serve)
                    return
                self._step()
        except BaseException as exc:  # a bug here must end every request, not hang them
            log.exception("DIAG: batch loop failed model=%s", self.model_id)
            error = exc if isinstance(exc, NodeError) else EngineError(f"llama.cpp generation failed: {exc}")
            with self._lock:
                waiting, self._pending = list(self._pending), collections.deque()
                self._running = False
            for seq in self._active + waiting:
                self._end(seq, error, drop=True)
            self._active = []

    def _step(self) -> None:
        self._admit()
        for seq in [s for s in self._active if s.job.cancel.is_set()]:
            self._end(seq, drop=not seq.job.keep_kv)
        if not self._active:
            return
        self._compact()
        ll, b = self.ll, self.batch
        # what each sequence feeds this step, chosen oldest request first: its next token (and its
        # draft), or a prompt chunk
        rows: dict[int, list[int]] = {}  # seq id -> tokens
        decoding = sum(1 for seq in self._active if seq.next_token is not None)
        room = self.n_batch - decoding  # batch rows left for drafts and prefill
        for seq in self._active:
            seq.out_index = -1
            seq.draft = []
            if seq.next_token is not None:
                pos = len(seq.slot.tokens)
                if seq.drafter is not None and room > 0:
                    # the draft must fit the context (its last position <= n_ctx - 1 with the next
                    # token's after it) and the request's remaining tokens
                    cap = min(room, self.n_ctx - 2 - pos, seq.job.max_new_tokens - seq.produced - 1)
                    seq.draft = seq.drafter.draft()[:max(0, cap)]
                    room -= len(seq.draft)
                rows[seq.slot.seq_id] = [seq.next_token, *seq.draft]
        drafting = sum(len(seq.draft) for seq in self._active)
        budget = min(self.prefill_chunk, room)
        for seq in self._active:
            if budget <= 0:
                break
            if seq.next_token is None and seq.rest:
                rows[seq.slot.seq_id] = seq.rest[:budget]
                budget -= len(rows[seq.slot.seq_id])
        # the batch: each sequence's rows together, in increasing id order (one ubatch, see above)
        n = 0
        fed: list[tuple[_Seq, list[int]]] = []
        for seq in sorted((s for s in self._active if s.slot.seq_id in rows), key=lambda s: s.slot.seq_id):
            tokens, sid, start = rows[seq.slot.seq_id], seq.slot.seq_id, len(seq.slot.tokens)
            if seq.next_token is not None:  # the next token's row and every draft row give logits
                seq.out_index = n
                want = [True] * len(tokens)
            else:  # a prompt chunk: logits for its last row when it ends the prompt
                want = [False] * len(tokens)
                if len(tokens) == len(seq.rest):
                    seq.out_index = n + len(tokens) - 1
                    want[-1] = True
            for i, token in enumerate(tokens):
                b.token[n] = token
                b.pos[n] = start + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = sid
                b.logits[n] = 1 if want[i] else 0
                n += 1
            fed.append((seq, [seq.next_token] if seq.next_token is not None else tokens))
        b.n_tokens = n
        started = time.monotonic()
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode returned {rc} for a batch of {n} tokens")
        self.steps += 1
        if decoding and n == decoding + drafting:  # pure decode steps only, for the advertised rate
            step_ms = (time.monotonic() - started) * 1000
            self.ms_per_token = step_ms if self.ms_per_token is None else 0.9 * self.ms_per_token + 0.1 * step_ms
        for seq, tokens in fed:
            seq.slot.tokens.extend(tokens)
            if seq.next_token is None:
                del seq.rest[:len(tokens)]
            seq.next_token = None
        for seq in list(self._active):
            if seq.out_index >= 0:
                if seq.drafter is not None:
                    self._verify(seq)
                else:
                    self._sample(seq)

    def _compact(self) -> None:
        """The running sequences onto consecutive ids (KvSlots.compact; the module docstring says why)."""
        moved = self.kv_slots.compact([seq.slot for seq in self._active])
        for seq in self._active:
            seq.slot = moved.get(seq.slot.seq_id, seq.slot)

    def _sample(self, seq: _Seq) -> None:
        ll, job = self.ll, seq.job
        if job.cancel.is_set():
            self._end(seq, drop=not job.keep_kv)
            return
        n_top = job.params.logprobs
        raw = None
        if seq.constraint is not None or n_top is not None:  # llama.cpp's own row, in place
            address = ctypes.cast(ll.llama_get_logits_ith(self.ctx, seq.out_index), ctypes.c_void_p).value
            row = np.frombuffer(self._row_type.from_address(address), dtype=np.float32)
            raw = row.copy() if n_top is not None else None  # the model's distribution, before bias and grammar
        try:
            if seq.constraint is not None:
                seq.constraint.apply(row)
            token = int(ll.llama_sampler_sample(seq.sampler, self.ctx, seq.out_index))
            seq.channel.put(token, None if raw is None else scores_from_logits(raw, token, n_top))
            seq.produced += 1
            if (seq.is_eog(token) or seq.produced >= job.max_new_tokens or job.cancel.is_set()
                    or len(seq.slot.tokens) >= self.n_ctx):
                self._end(seq, drop=job.cancel.is_set() and not job.keep_kv)
                return
            if seq.constraint is not None:
                seq.constraint.accept(token)
        except NodeError as exc:
            self._end(seq, exc, drop=True)
            return
        seq.next_token = token

    def _verify(self, seq: _Seq) -> None:
        """Sample a speculating sequence's rows in order: the draft stands while the sampled token
        equals it; the KV of the rejected draft positions is removed (see the module docstring)."""
        ll, job, slot = self.ll, seq.job, seq.slot
        if job.cancel.is_set():
            if job.keep_kv and seq.draft:  # the slot's tokens are its KV: the unverified draft leaves
                ll.llama_memory_seq_rm(self.mem, slot.seq_id, len(slot.tokens), -1)
            self._end(seq, drop=not job.keep_kv)
            return
        draft, out, ended = seq.draft, [], False
        for i in range(len(draft) + 1):
            token = int(ll.llama_sampler_sample(seq.sampler, self.ctx, seq.out_index + i))
            out.append(token)
            seq.channel.put(token)
            seq.produced += 1
            if (seq.is_eog(token) or seq.produced >= job.max_new_tokens or job.cancel.is_set()
                    or len(slot.tokens) >= self.n_ctx):
                ended = True
                break
            if i == len(draft) or token != draft[i]:
                break
            slot.tokens.append(token)  # a confirmed draft token: its KV (from this step) stays
        if draft:
            # draft positions beyond the confirmed ones leave the KV (the slot's tokens are its KV)
            ll.llama_memory_seq_rm(self.mem, slot.seq_id, len(slot.tokens), -1)
            accepted = accept_count(draft, out)
            seq.drafter.observe(len(draft), accepted)
            self.spec_drafted += len(draft)
            self.spec_accepted += accepted
        seq.drafter.extend(out)
        seq.draft = []
        if ended:
            self._end(seq, drop=job.cancel.is_set() and not job.keep_kv)
            return
        seq.next_token = out[-1]

    def _admit(self) -> None:
        later: list[_Seq] = []  # choices waiting for a sibling's prefill, kept first in line
        try:
            self._admit_some(later)
        finally:
            if later:
                with self._lock:
                    self._pending.extendleft(reversed(later))

    def _admit_some(self, later: list[_Seq]) -> None:
        while len(self._active) < self.max_concurrent:
            with self._lock:
                if not self._pending:
                    return
                seq = self._pending.popleft()
            if seq.job.cancel.is_set():
                self._end(seq)
                continue
            if self._sibling_prefilling(seq):
                later.append(seq)
                continue
            try:
                self._start(seq)
            except NodeError as exc:
                self._end(seq, exc, drop=True)
                continue
            except Exception as exc:  # noqa: BLE001 - a sampler or grammar failure ends this request only
                self._end(seq, EngineError(f"llama.cpp could not start the generation: {exc}"), drop=True)
                continue
            self._active.append(seq)
            self.max_active_seen = max(self.max_active_seen, len(self._active))

    def _copy_min(self, job: GenerationJob) -> int:
        return COPY_MIN_TOKENS if job.params.greedy else COPY_MIN_TOKENS_SAMPLED

    def _sibling_prefilling(self, seq: _Seq) -> bool:
        """Another choice of the same request (OpenAI's `n`) is prefilling this prompt: this one
        waits and starts from a copy of its KV (llama-server's n_cmpl children do the same). A prompt
        too short to be copied (kv_slots' COPY_MIN_TOKENS) prefills on its own, at once."""
        job = seq.job
        if not job.group or len(job.prompt_tokens) - 1 < self._copy_min(job):
            return False
        return any(s.job.group == job.group and s.rest and s.job.prompt_tokens == job.prompt_tokens
                   for s in self._active)

    def _start(self, seq: _Seq) -> None:
        job, p = seq.job, seq.job.params
        prompt = list(job.prompt_tokens)
        if not prompt or len(prompt) >= self.n_ctx:
            raise EngineError(f"a prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx}")
        if p.constrained:
            if seq.vocab is None:
                raise EngineError("a constrained generation needs the model's vocabulary")
            seq.constraint = constrain.constraint_for(seq.vocab, p, job.history)
        seq.sampler = self._sampler(p)
        if self.speculative_max_draft > 0:
            off = speculation_off_reason(p)
            if off is None:
                seq.drafter = NgramDrafter(prompt, max_k=self.speculative_max_draft)
            else:
                log.debug("DIAG: n-gram speculation off for this request %s", kv(request_id=job.request_id, reason=off))
        siblings = tuple(s.slot for s in self._active if job.group and s.job.group == job.group and not s.rest)
        slot, reused = self.kv_slots.choose(prompt, job.request_id, self._copy_min(job), siblings)
        slot.busy = True
        seq.slot = slot
        self.ll.llama_memory_seq_rm(self.mem, slot.seq_id, reused, -1)
        del slot.tokens[reused:]
        seq.rest = prompt[reused:]
        job.cached_tokens = reused

    def _sampler(self, p):
        ll = self.ll
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_penalties(
                self.n_vocab, PENALTY_LAST_N, p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        if p.greedy:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
            return chain
        if p.top_k > 0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(p.temperature))
        seed = p.seed if p.seed is not None else random.getrandbits(32)
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _end(self, seq: _Seq, error: BaseException | None = None, *, drop: bool = False) -> None:
        """The request is over: free its sampler, release its slot (its KV stays cached unless
        `drop`: a cancel or an error removes it from the KV at once), close its channel."""
        if seq in self._active:
            self._active.remove(seq)
        if seq.drafter is not None:  # seed 000's summary line, once per request
            log.debug("DIAG: local n-gram speculation complete %s",
                      kv(request_id=seq.job.request_id, **seq.drafter.stats.as_kv()))
            seq.drafter = None
        if seq.sampler is not None:
            self.ll.llama_sampler_free(seq.sampler)
            seq.sampler = None
        slot = seq.slot
        if slot is not None:
            if drop:
                self.ll.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
                log.debug("DIAG: KV-cache sequence freed %s", kv(
                    request_id=seq.job.request_id, seq=slot.seq_id, tokens=len(slot.tokens),
                    reason="error" if error is not None else "cancelled"))
                slot.tokens.clear()
            slot.busy = False
            slot.last_used = time.monotonic()
            seq.slot = None
        seq.channel.close(error)
        if not seq.future.done():
            seq.future.set_result(None)

    # --- inspection (tests, diagnostics; any thread, approximate while running) ---

    def kv_tokens(self) -> dict[int, int]:
        return self.kv_slots.kv_tokens()

    def cached_sequences(self) -> int:
        return self.kv_slots.cached_sequences()

    # --- teardown (executor thread, after the loop has stopped) ---

    def close(self) -> None:
        with self._lock:
            ctx, self.ctx = self.ctx, None
            waiting, self._pending = list(self._pending), collections.deque()
        for seq in self._active + waiting:
            self._end(seq, EngineError(f"model {self.model_id} was unloaded"))
        self._active = []
        if ctx is not None:
            self.ll.llama_batch_free(self.batch)
            self.ll.llama_free(ctx)
