"""`SliceModel`: layers [start, end) of a GGUF model in torch, with per-request KV sessions.

    model = SliceModel.load(path, 0, 8, dtype="auto")      # blocking: call from the model's executor
    sess = model.new_session("req-1")
    hidden = model.forward(sess, token_ids, index_pos=0)    # first slice: ids in, hidden out
    logits = last.forward(sess2, hidden, index_pos=0, last_only=True)

The first slice embeds token ids; the last applies the final norm and the output head (tied to
the token embeddings when `output.weight` is absent). A session may run a sub-range [a, b) of the
loaded layers (`new_session(sid, a, b)`): its KV covers only those, it embeds ids when a == 0, takes
hidden states otherwise, and applies the head only when b is the model's last layer. Hidden states cross slice boundaries as
float32 [T, H]. Call `forward` from one thread at a time (a single-thread executor per model).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from node.errors import EngineError, KvPositionMismatch, ModelLoadError
from node.inference.arch import family
from node.inference.arch.block import Block, attention_mask, block_forward_many
from node.inference.arch.common import ModelConfig, RotaryTables, rms_norm
from node.inference.slice.formats import cache_kernel_name, resolve_format, resolve_kernel, resolve_kv_dtype
from node.inference.slice.session import Session, SessionStore
from node.inference.weights.cache import CACHED_FORMATS, CacheKey, WeightCache
from node.inference.weights.gguf_file import GgufFile
from node.inference.weights.linear import Linear, linear_from_arrays, make_linear
from node.logs import MESSAGE, TRACE, kv

log = logging.getLogger(__name__)

LEGACY_PREFILL8_MIN_ROWS = 32  # steps that do not say their prompt rows: more rows than this take 8 bits
LOAD_WORKERS = 2  # layers converted at once while loading (each holds one layer's float32 transients)


@dataclass(frozen=True)
class SliceInfo:
    """What a slice holds (for HELLO frames, the admin API and logs)."""

    arch: str
    layer_start: int
    layer_end: int
    n_layers_total: int
    fmt: str
    device: str


class SliceModel:
    """A contiguous range of decoder blocks of one GGUF model, ready to run."""

    def __init__(self, f: GgufFile, cfg: ModelConfig, start: int, end: int, fmt: str,
                 device: torch.device, max_ctx: int, blocks: list[Block],
                 head: tuple[torch.Tensor, Linear] | None, name: str, kv_dtype: torch.dtype | None = None):
        self.file, self.config, self.fmt, self.device = f, cfg, fmt, device
        self.layer_start, self.layer_end = start, end
        self.n_ctx = max_ctx
        self.name = name
        self.blocks = blocks
        self.head = head
        self.rotary = RotaryTables(cfg.rope, device)
        self.kv_dtype = kv_dtype or resolve_kv_dtype("auto", device)  # the sessions' K and V
        self.sessions = SessionStore(name)
        self.weight_cache = "off"  # how the load went: off, hit, miss or partial (set by load)
        self.kernel = "torch"  # the matrix kernel: qgemm or fbgemm (int8), torch (the float formats)
        self.load_ms = 0
        self._lock = threading.Lock()

    # --- loading -----------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, layer_start: int = 0, layer_end: int | None = None, *,
             dtype: str = "auto", device: str | torch.device = "cpu", n_threads: int | None = None,
             max_ctx: int | None = None, name: str | None = None, exact_prefill: bool = False,
             cache: WeightCache | None = None, sha256: str | None = None, kernel: str | None = None,
             kv_dtype: str = "auto", expect: tuple[int, int] | None = None) -> SliceModel:
        """Load layers [layer_start, layer_end) (0-based; None = to the last) of the GGUF at `path`.

        Blocking (reads and converts weights): run it in the model's executor. `n_threads` sets
        torch's intra-op threads for the whole process. `exact_prefill` (int8): long prefills
        take the residual pass on every matrix, as decode does (logits of every prompt position
        as good as decode's) at about half the prefill speed. `cache` with the file's `sha256`:
        converted parts are read from it instead of converting, and written to it when missing.
        `kernel` (int8): "qgemm" or "fbgemm"; None = the one measured fastest on this machine
        (`weights/kernels.choose_int8_kernel`, remembered next to the cache). `kv_dtype`: the KV
        caches' element type (`resolve_kv_dtype`: auto is f16). `expect`: the (size, mtime_ns) the file
        was hashed at: other at the open, or changed while loading, is FileChangedWhileOpen.
        """
        t0 = time.perf_counter()
        if n_threads:
            torch.set_num_threads(n_threads)
        device = torch.device(device)
        f = GgufFile(path, expect=expect)
        fam = family(f.arch)
        cfg = fam.config(f)
        end = cfg.n_layers if layer_end is None else layer_end
        if not 0 <= layer_start < end <= cfg.n_layers:
            raise ModelLoadError(f"layer range [{layer_start}, {end}) is outside the model's {cfg.n_layers} layers")
        fmt = resolve_format(dtype, device)
        kv_type = resolve_kv_dtype(kv_dtype, device)  # an unknown name fails before any work
        last = end == cfg.n_layers  # the slice ends at the model's last layer: it holds the head
        kernel = resolve_kernel(fmt, kernel, cfg.hidden, cache)
        key = CacheKey(sha256, fmt, cache_kernel_name(kernel), "std") \
            if cache is not None and cache.enabled and sha256 and fmt in CACHED_FORMATS else None
        writable = key is not None and cache.reserve(key, estimate_bytes(path, layer_start, end, fmt))
        hits = []  # one bool per part: read from the cache

        def cached(part: str, convert, rebuild):
            arrays = cache.read(key, part) if key is not None else None
            hits.append(arrays is not None)
            if arrays is not None:
                return rebuild(arrays)
            keep: dict[str, np.ndarray] | None = {} if writable else None
            built = convert(keep)
            if keep:  # (read from bytes its sha256 names, else cached under it for good: review r34)
                f.check_unchanged()
                cache.write(key, part, keep)
            return built

        def build_head() -> tuple[torch.Tensor, Linear]:
            name_w = "output.weight" if f.has("output.weight") else "token_embd.weight"

            def convert(keep):
                norm = f.f32("output_norm.weight")
                if keep is not None:
                    keep["norm"] = norm
                parts: dict[str, np.ndarray] | None = None if keep is None else {}
                lin = make_linear(f.row_source(name_w), f.f32_or_none("output.bias"), fmt, device, sensitive=True,
                                  keep=parts, kernel=kernel)
                if keep is not None:
                    keep.update({f"head.{k}": v for k, v in parts.items()})
                return torch.from_numpy(norm).to(device), lin

            def rebuild(arrays):
                head = {k[5:]: v for k, v in arrays.items() if k.startswith("head.")}
                return (torch.from_numpy(np.array(arrays["norm"], dtype=np.float32)).to(device),
                        linear_from_arrays(head, fmt, sensitive=True, kernel=kernel))

            return cached("head", convert, rebuild)

        def build(i: int) -> Block:
            return cached(f"layer-{i:04d}",
                          lambda keep: Block.build(fam.load_layer(f, cfg, i), fmt, device, exact_prefill=exact_prefill,
                                                   keep=keep, kernel=kernel),
                          lambda arrays: Block.from_arrays(arrays, fmt, device, exact_prefill=exact_prefill,
                                                           kernel=kernel))

        workers = _load_workers(path, layer_start, end, fmt)
        try:
            with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="slice-load") as pool:
                head_job = pool.submit(build_head) if last else None
                blocks = []
                for block in pool.map(build, range(layer_start, end)):
                    blocks.append(block)
                    f.release_pages()  # the converted copy is what we keep: drop the file pages we read
                    _trim_heap()  # and give the freed float32 temporaries back to the OS
                head = head_job.result() if head_job is not None else None
        finally:
            if key is not None:
                cache.release(key)
        f.release_pages()
        _trim_heap()
        f.check_unchanged()  # (written over in place while converting: a mix of two files' layers)
        model = cls(f, cfg, layer_start, end, fmt, device, max_ctx or cfg.n_ctx_train, blocks, head,
                    name or Path(path).stem, kv_type)
        model.kernel = kernel
        model.weight_cache = ("off" if key is None else "hit" if all(hits) else "miss" if not any(hits) else "partial")
        model.load_ms = round((time.perf_counter() - t0) * 1000)
        log.info(
            "DIAG: slice model loaded %s",
            kv(model=model.name, arch=cfg.arch, layers=f"{layer_start}-{end - 1}", n_layers=cfg.n_layers,
               dtype=fmt, device=str(device), threads=torch.get_num_threads(), load_workers=workers,
               weight_cache=model.weight_cache, cached_parts=f"{sum(hits)}/{len(hits)}",
               kernel=kernel, kv_dtype=model.kv_name, load_ms=model.load_ms),
        )
        return model

    # --- properties ----------------------------------------------------------------------------

    @property
    def kv_name(self) -> str:
        """The KV caches' type as logs and reports name it: float16 or float32."""
        return str(self.kv_dtype).removeprefix("torch.")

    @property
    def is_first(self) -> bool:
        return self.layer_start == 0

    @property
    def is_last(self) -> bool:
        return self.layer_end == self.config.n_layers

    @property
    def n_layers_total(self) -> int:
        return self.config.n_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden

    @property
    def vocab_size(self) -> int:
        return self.config.vocab

    @property
    def arch(self) -> str:
        return self.config.arch

    @property
    def info(self) -> SliceInfo:
        return SliceInfo(self.arch, self.layer_start, self.layer_end, self.n_layers_total, self.fmt, str(self.device))

    # --- sessions ------------------------------------------------------------------------------

    def new_session(self, session_id: str, start: int | None = None, end: int | None = None,
                    coordinator: str | None = None) -> Session:
        """A fresh KV cache for one request over layers [start, end) (default: all loaded ones;
        any sub-range of them), replacing a session with the same id; `coordinator`: the one node
        that may keep it when it ends (SESSION_END keep)."""
        start = self.layer_start if start is None else start
        end = self.layer_end if end is None else end
        if not self.layer_start <= start < end <= self.layer_end:
            raise EngineError(f"layers {start}-{end - 1} are not within this slice's "
                              f"{self.layer_start}-{self.layer_end - 1}")
        shape = (end - start, self.config.n_kv_heads, self.config.head_dim)
        sess = Session(session_id, shape, self.n_ctx, self.kv_dtype, self.device, start)
        sess.coordinator = coordinator
        return self.sessions.add(sess)

    def session(self, session_id: str) -> Session | None:
        """An existing session or None."""
        return self.sessions.get(session_id)

    def free_session(self, session_id: str, unless_kept: bool = False) -> bool:
        """Drop a session's KV cache (SESSION_END); True if it existed (`unless_kept`: not a kept one)."""
        return self.sessions.free(session_id, unless_kept=unless_kept)

    def resume_session(self, kept_id: str, session_id: str, keep: int, coordinator: str,
                       start: int, end: int, copy: bool = False, room: int = 0) -> Session:
        """A kept session as `session_id`, cut to `keep` positions (KvCacheMiss if it cannot be);
        `copy`: a new session with a copy of those positions (capacity for `room` more), the kept
        one stays."""
        return self.sessions.resume(kept_id, session_id, keep, coordinator, start, end, copy, room)

    def sweep_sessions(self, ttl_s: float | None = None, max_bytes: int | None = None,
                       kept_ttl_s: float | None = None, kept_only: bool = False) -> list[str]:
        """Evict idle sessions (TTL; kept ones after kept_ttl_s) and least-recently-used ones over
        `max_bytes` (kept ones first; `kept_only`: only those); logs each."""
        return self.sessions.sweep(ttl_s, max_bytes, kept_ttl_s, kept_only)

    # --- compute -------------------------------------------------------------------------------

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, H] (first slice), read from the file (see `GgufFile.lookup`)."""
        rows = self.file.lookup("token_embd.weight", ids.cpu().numpy())
        return torch.from_numpy(rows).to(self.device)

    def forward(self, sess: Session | str, inputs, index_pos: int, *, last_only: bool = False,
                prompt_rows: int | None = None) -> torch.Tensor:
        """Run the session's layers on `inputs` at positions [index_pos, index_pos+T).

        inputs: token ids [T] when the session starts at layer 0, float hidden states [T, H]
        otherwise. Returns hidden [T, H] float32, or when the session ends at the model's last
        layer logits [T, V] ([1, V] with `last_only`), always as CPU tensors. Raises KvPositionMismatch unless index_pos equals the session's kv_len.
        `prompt_rows`: how many of the first rows are prompt tokens (the rest generated ones); with
        it every row's numbers are those it has in a step of any size or batch (see
        block_forward_many), and the prompt's may take the faster 8-bit products (qgemm's slices;
        the others ignore it). None: as before it was said (one row decoded, several attended
        together; on VNNI a step of more than 32 rows takes the 8-bit products).
        """
        if isinstance(sess, str):
            found = self.sessions.get(sess)
            if found is None:
                raise EngineError(f"no KV session {sess} on this slice")
            sess = found
        with self._lock, torch.inference_mode():
            return self._forward_many([(sess, inputs, index_pos, last_only, prompt_rows)])[0]

    def forward_many(self, steps: list[tuple]) -> list[torch.Tensor]:
        """Several sessions' steps (session, inputs, index_pos, last_only[, prompt_rows]) as one batched forward:
        each matrix runs once over all their rows, attention per session over its own KV. The
        sessions must be distinct and run the same layers. Returns each step's `forward` output.
        Every step is checked (positions, inputs, context) before anything is computed."""
        with self._lock, torch.inference_mode():
            return self._forward_many(steps)

    def _forward_many(self, steps: list[tuple]) -> list[torch.Tensor]:
        t0 = time.perf_counter()
        sess0 = steps[0][0]
        first = sess0.layer_start == 0
        group = self.config.n_heads // self.config.n_kv_heads
        xs, sessions, counts, masks, ropes = [], [], [], [], []
        prompts = [step[4] if len(step) > 4 else None for step in steps]
        # rows by kind (see forward's prompt_rows) where that makes them exact: qgemm's CPU slices
        # (MKL's float products and fbgemm's per-call grids depend on the rows anyway)
        kinds = self.kernel == "qgemm" and any(p is not None for p in prompts)
        for (sess, inputs, index_pos, *_), n_prompt in zip(steps, prompts, strict=True):
            if index_pos != sess.kv_len:
                raise KvPositionMismatch(index_pos, sess.kv_len, session=sess.session_id)
            if (sess.layer_start, sess.layer_end) != (sess0.layer_start, sess0.layer_end) or sess in sessions:
                raise EngineError("a batched forward takes distinct sessions over the same layers")
            x = self._input(inputs, first)
            if n_prompt is not None and not 0 <= n_prompt <= x.shape[0]:
                raise EngineError(f"prompt_rows={n_prompt} for a step of {x.shape[0]} rows")
            sess.reserve(index_pos + x.shape[0])
            xs.append(x)
            sessions.append(sess)
            counts.append(x.shape[0])
            masks.append(attention_mask(x.shape[0], index_pos, group, self.device))
            ropes.append(self.rotary.get(index_pos, x.shape[0]))
        if len(steps) == 1:
            x, rope = xs[0], ropes[0]
        else:
            x = torch.cat(xs)
            rope = (torch.cat([r[0] for r in ropes]), torch.cat([r[1] for r in ropes]))
        trace = log.isEnabledFor(TRACE)
        lo = sess0.layer_start - self.layer_start
        blocks = self.blocks if lo == 0 and sess0.n_layers == len(self.blocks) else self.blocks[lo:lo + sess0.n_layers]
        positions = [step[2] for step in steps]
        prompt_rows = prompts if kinds else None
        rows8 = _rows8(counts, prompts) if self.kernel == "qgemm" else None
        single = len(steps) == 1
        s0, p0, n0, m0 = sessions[0], positions[0], counts[0], masks[0]
        for i, block in enumerate(blocks):
            tl = time.perf_counter() if trace else 0.0
            if single:  # decode's common case: no per-layer zip
                parts = ((s0.k[i], s0.v[i], p0, n0, m0),)
            else:
                parts = [(s.k[i], s.v[i], pos, n, m) for s, pos, n, m in zip(sessions, positions, counts, masks, strict=True)]
            x = block_forward_many(block, self.config, x, parts, rope, prompt_rows, rows8)
            if trace:
                log.log(TRACE, "DIAG: layer forward complete %s",
                        kv(layer=sess0.layer_start + i, layer_ms=f"{(time.perf_counter() - tl) * 1000:.2f}"))
        now = time.monotonic()
        for sess, pos, n in zip(sessions, positions, counts, strict=True):
            sess.kv_len = pos + n
            sess.last_used = now
        last = sess0.layer_end == self.config.n_layers
        outs = list(x.split(counts)) if len(steps) > 1 else [x]
        if last:  # the head is loaded whenever the slice ends at the model's last layer
            rows = [o[-1:] if step[3] else o for o, step in zip(outs, steps, strict=True)]
            norm, head = self.head
            logits = head(rms_norm(rows[0] if len(rows) == 1 else torch.cat(rows), norm, self.config.rms_eps))
            outs = list(logits.split([r.shape[0] for r in rows])) if len(rows) > 1 else [logits]
        if log.isEnabledFor(MESSAGE):
            log.log(MESSAGE,
                "DIAG: SplitModel forward pass complete %s",
                kv(forward_ms=f"{(time.perf_counter() - t0) * 1000:.2f}", seq_len=sum(counts), num_layers=len(blocks),
                   is_first=first, is_last=last, index_pos=positions[0], kv_offset=positions[0],
                   session=sess0.session_id, batch=len(steps)),
            )
        # callers (wire, sampler) get CPU tensors
        return [o if o.device.type == "cpu" else o.float().cpu() for o in outs]

    def _input(self, inputs, first: bool) -> torch.Tensor:
        x = self.check_input(inputs, first)
        return self.embed(x) if first else x

    def check_input(self, inputs, first: bool) -> torch.Tensor:
        """A step's inputs, checked: token ids in the vocabulary (a session starting at layer 0),
        else float hidden states [T, H] as contiguous float32 (EngineError naming what is wrong).
        A batch's caller checks each step with it first, so one bad step fails alone."""
        if first:
            ids = torch.as_tensor(inputs)
            if ids.dim() != 1 or ids.dtype.is_floating_point or ids.numel() == 0:
                raise EngineError("the first slice takes a non-empty 1-D tensor of token ids")
            if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab:
                raise EngineError(f"token id out of range [0, {self.config.vocab})")
            return ids
        x = torch.as_tensor(inputs)
        if x.dim() != 2 or x.shape[1] != self.config.hidden or x.shape[0] == 0 or not x.dtype.is_floating_point:
            raise EngineError(f"a session not starting at layer 0 takes float hidden states [T, {self.config.hidden}]")
        return x.to(device=self.device, dtype=torch.float32).contiguous()


def _rows8(counts: list[int], prompts: list[int | None]) -> torch.Tensor | None:
    """The stacked rows that may take qgemm's 8-bit products (None: none): each step's prompt rows;
    a step that does not say them (an older coordinator's) all its rows when it has more than
    LEGACY_PREFILL8_MIN_ROWS, as it would alone: so, however steps are batched, each takes the
    products it would take alone (older nodes never batched more than that many rows)."""
    marked = [p if p is not None else n if n > LEGACY_PREFILL8_MIN_ROWS else 0 for n, p in zip(counts, prompts, strict=True)]
    if not any(marked):
        return None
    return torch.cat([torch.arange(n) < m for n, m in zip(counts, marked, strict=True)])


def _trim_heap() -> None:
    """Return free heap memory to the OS (glibc keeps freed arenas; the RSS would stay high)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def _load_workers(path: str | Path, start: int, end: int, fmt: str) -> int:
    """How many matrices convert at once while loading. Most of an int8 load is fbgemm's weight
    prepack and the dequantise / quantise passes, which release the GIL: on 2 cores (AMD EPYC)
    two workers take the 1B-shaped model's load from 31 s to 18 s, but raise its peak RSS from
    1.9 to 2.3 GB (two matrices' float32 transients and file pages at once), so they run in
    parallel only where the free memory is at least twice the slice's weights."""
    import psutil

    workers = max(1, min(LOAD_WORKERS, torch.get_num_threads(), end - start + 1))
    if workers > 1 and psutil.virtual_memory().available < 2 * estimate_bytes(path, start, end, fmt):
        return 1
    return workers


def estimate_bytes(path: str | Path, layer_start: int = 0, layer_end: int | None = None, fmt: str = "int8", *,
                   header_of_size: int | None = None) -> int:
    """Weight bytes a slice will hold in `fmt` (for placement), from tensor shapes only (`path` may
    be a header alone: see GgufFile's `header_of_size`)."""
    f = GgufFile(path, header_of_size=header_of_size)
    n_layers = int(f.arch_field("block_count", 0))
    end = n_layers if layer_end is None else layer_end
    per_elem = {"f32": 4, "bf16": 2, "f16": 2, "int8": 1}[fmt]
    total = 0
    for name in f.tensors:
        parts = name.split(".")
        if parts[0] == "blk":
            keep = layer_start <= int(parts[1]) < end
        elif name == "token_embd.weight":
            keep = end == n_layers and not f.has("output.weight")  # embeddings stay mapped; tied head
        else:
            keep = end == n_layers
        if keep:
            total += int(np.prod(f.shape(name))) * per_elem
    return total
