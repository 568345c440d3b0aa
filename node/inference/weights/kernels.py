"""Which int8 kernel a machine runs: qgemm (`weights/qgemm.py`) or fbgemm (`weights/linear.py`).

    kernel = choose_int8_kernel(width, remember=path)   # measured once per machine, then remembered

Measured at the first int8 load on a machine: a request-shaped product (two 64-row prefills and 64
decode rows on a [2·width, width] matrix) on both kernels, the faster one taken. It
is remembered in a small JSON file next to the weight cache, keyed by what decides it (CPU and its
SIMD flags, the kernel's instruction set and version, torch, threads, width); another key is
measured again. `SWARMLLM_INT8_KERNEL=qgemm|fbgemm` forces one. Blocking: a loader's executor.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np
import torch

from node.inference.weights import qgemm
from node.inference.weights.linear import ArraySource, fbgemm_available, make_linear
from node.logs import kv

log = logging.getLogger(__name__)

KERNELS = ("qgemm", "fbgemm")
PREFILL_ROWS = 64  # the measured request: 2 prefills of this many rows and DECODE_STEPS decode rows
DECODE_STEPS = 64
FBGEMM_MARGIN = 1.25  # fbgemm is chosen only when this much faster than qgemm (see measure)

_choice_lock = threading.Lock()
_chosen: dict[tuple, dict] = {}
_ignored_forced: set[str] = set()  # SWARMLLM_INT8_KERNEL values already warned about


def machine_key(width: int) -> dict[str, str | int]:
    """What decides which kernel wins here: CPU, instruction set, versions, threads and width."""
    from node.sysinfo import cpu_features, cpu_name

    return {"cpu": cpu_name(), "features": " ".join(cpu_features()), "machine": platform.machine(),
            "isa": qgemm.isa(), "torch": torch.__version__, "kernel_version": qgemm.KERNEL_VERSION,
            "threads": torch.get_num_threads(), "width": width}


def choose_int8_kernel(width: int = 2048, *, remember: Path | None = None) -> str:
    """"qgemm" or "fbgemm": whichever serves a request-shaped product faster on this machine
    (measured once per machine key, remembered in `remember` when given). Where only one is there
    (no compiled kernel; or no fbgemm, as on ARM) it is that one without measuring. Callers ask
    only where one is (`linear.int8_available()`)."""
    forced = os.environ.get("SWARMLLM_INT8_KERNEL")
    if (forced == "fbgemm" and fbgemm_available()) or (forced == "qgemm" and qgemm.available()):
        return forced
    if forced and forced not in _ignored_forced:
        _ignored_forced.add(forced)
        log.warning("DIAG: SWARMLLM_INT8_KERNEL=%s ignored: %s", forced,
                    "not an int8 kernel (qgemm, fbgemm)" if forced not in KERNELS else "not available here")
    if not qgemm.available():
        return "fbgemm"
    if not fbgemm_available():
        return "qgemm"
    key = machine_key(width)
    frozen = tuple(sorted(key.items()))
    with _choice_lock:
        if frozen in _chosen:
            return _chosen[frozen]["kernel"]
        record = _read_remembered(remember, key)
        if record is None:
            record = dict(key, **measure(width))
            _write_remembered(remember, record)
            log.info("DIAG: int8 kernel chosen by measurement %s",
                     kv(kernel=record["kernel"], isa=key["isa"], width=width, threads=key["threads"],
                        qgemm_request_ms=record["qgemm_request_ms"], fbgemm_request_ms=record["fbgemm_request_ms"]))
        _chosen[frozen] = record
        return record["kernel"]


def chosen_records() -> list[dict]:
    """The measurements behind this process's choices (for diagnostics)."""
    with _choice_lock:
        return list(_chosen.values())


def measure(width: int, *, rounds: int = 5) -> dict[str, float | str]:
    """Times one request-shaped product (2 prefills of PREFILL_ROWS rows + DECODE_STEPS decode rows,
    a [width·2, width] matrix) on both kernels, in `rounds` pairs (qgemm then fbgemm, back to back:
    a busy spell of the machine lands on both of a pair). qgemm is taken unless fbgemm is faster
    by more than FBGEMM_MARGIN in every pair: its rows are exact alone (the same bits in any step or
    batch, which fbgemm's per-call grids are not), and a win in some pairs only is noise. With six
    nodes loading at once on 2 vCPUs, best-of-3 one kernel after the other gave 441 ms against 137
    and best-of-5 interleaved 37.8 against 7.0 (qgemm is ~1.6x faster here unloaded), each putting
    a chain's segment on fbgemm (whose greedy text then parted between speculation on and off)."""
    width = max(64, min(int(width), 4096))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2 * width, width), dtype=np.float32) * 0.02  # 128 MB at 4096: a load's transient
    cpu = torch.device("cpu")
    ours = make_linear(ArraySource(w), None, "int8", cpu, kernel="qgemm")
    theirs = make_linear(ArraySource(w), None, "int8", cpu, kernel="fbgemm")
    prefill = torch.from_numpy(rng.standard_normal((PREFILL_ROWS, width), dtype=np.float32))
    decode = torch.from_numpy(rng.standard_normal((1, width), dtype=np.float32))
    prompt = torch.ones(PREFILL_ROWS, dtype=torch.bool)  # qgemm's prefill rows are prompt rows (rows8)

    def request_ms(lin) -> float:
        fill = (lambda x: lin(x, prompt)) if lin is ours else lin
        t0 = time.perf_counter()
        for _ in range(2):
            fill(prefill.clone())
        for _ in range(DECODE_STEPS):
            lin(decode.clone())
        return (time.perf_counter() - t0) * 1000

    request_ms(ours), request_ms(theirs)  # warm
    pairs = [(request_ms(ours), request_ms(theirs)) for _ in range(rounds)]
    q_ms, f_ms = min(q for q, _ in pairs), min(f for _, f in pairs)
    return {"kernel": chosen_from(pairs), "qgemm_request_ms": round(q_ms, 3),
            "fbgemm_request_ms": round(f_ms, 3), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def faster(qgemm_ms: float, fbgemm_ms: float) -> str:
    """One pair's verdict: qgemm unless fbgemm is more than FBGEMM_MARGIN faster."""
    return "fbgemm" if fbgemm_ms * FBGEMM_MARGIN < qgemm_ms else "qgemm"


def chosen_from(pairs: list[tuple[float, float]]) -> str:
    """fbgemm only when every (qgemm_ms, fbgemm_ms) pair says so (see measure)."""
    return "fbgemm" if pairs and all(faster(q, f) == "fbgemm" for q, f in pairs) else "qgemm"


def _read_remembered(path: Path | None, key: dict) -> dict | None:
    if path is None:
        return None
    try:
        records = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    for record in records if isinstance(records, list) else []:
        if isinstance(record, dict) and all(record.get(k) == v for k, v in key.items()) \
                and record.get("kernel") in KERNELS:
            return record
    return None


def _write_remembered(path: Path | None, record: dict) -> None:
    if path is None:
        return
    path = Path(path)
    try:
        records = json.loads(path.read_text()) if path.exists() else []
    except (OSError, ValueError):
        records = []
    fields = machine_key(record["width"]).keys()
    records = [r for r in records if isinstance(r, dict) and any(r.get(k) != record[k] for k in fields)][-15:]
    records.append(record)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(records, indent=1))
        tmp.replace(path)
    except OSError as e:
        log.warning("DIAG: int8 kernel choice not remembered %s", kv(path=str(path), error=str(e)))
