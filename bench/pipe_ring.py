"""The machine's floor for a split: the same slices as `swarmllm run --layers`, one process each,
passing f16 hidden states through OS pipes — no event loop, TLS, framing, JSON or thread hand-off.

What a pipeline loses on this machine beyond this ring is the node's hop cost; what the ring itself
loses against one process is the machine's (processes waking cold, cores shared between segments).
Each process has `swarmllm run`'s process settings (node/runtime.py) and loads its slice with the
slice engine's defaults and uses the wire's activation codec; the
last one samples greedily and sends the token back to the first. Decode tok/s is timed in the first
process over `tokens` steps after a warm-up.

    python bench/pipe_ring.py --segments 3 --threads 2            # the pipeline bench's model
    python bench/pipe_ring.py --model M.gguf --segments 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WARMUP = 16
_LEN = struct.Struct("<I")


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("pipe ring: no data before the deadline")
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("ring broken")
        buf += chunk
    return bytes(buf)


def _worker(model: str, start: int, end: int, threads: int, steps: int, rfd: int, wfd: int, ready_fd: int) -> None:
    from node.runtime import configure_process

    configure_process()  # the process settings of `swarmllm run` (OpenMP spin), before torch loads
    import torch

    from node.inference.pipeline.wire import decode_activations, encode_activations
    from node.inference.slice.model import SliceModel

    m = SliceModel.load(model, start, end, n_threads=threads)
    sess = m.new_session("ring")
    os.write(ready_fd, b"r")
    stamps = []
    for pos in range(steps):
        (n,) = _LEN.unpack(_read_exact(rfd, 4))
        msg = _read_exact(rfd, n)
        if m.is_first:
            stamps.append(time.perf_counter())
            inputs = torch.tensor([int.from_bytes(msg[:4], "little")], dtype=torch.long)
        else:
            meta_len = int.from_bytes(msg[:4], "little")
            inputs = decode_activations(json.loads(msg[4:4 + meta_len]), msg[4 + meta_len:])
        out = m.forward(sess, inputs, pos, last_only=m.is_last)
        if m.is_last:
            reply = int(out[-1].argmax()).to_bytes(4, "little")
        else:
            meta, data = encode_activations(out, 16)
            meta_b = json.dumps(meta).encode()
            reply = len(meta_b).to_bytes(4, "little") + meta_b + data
        os.write(wfd, _LEN.pack(len(reply)) + reply)
    if m.is_first:
        print(json.dumps(stamps), flush=True)


def ring_decode(model: Path, n_layers: int, segments: int, threads: int, tokens: int, reps: int = 3,
                timeout_s: float = 600.0) -> float:
    """Decode tok/s of `segments` processes in a pipe ring (1 = one process, no pipes crossed):
    the median of `reps` windows of `tokens` steps, after a warm-up. A process that dies or a ring
    that stalls raises instead of hanging (every read has a deadline)."""
    bounds = [round(i * n_layers / segments) for i in range(segments + 1)]
    pipes = [os.pipe() for _ in range(segments)]  # pipes[i]: into process i
    ready_r, ready_w = os.pipe()
    steps = WARMUP + tokens * reps
    procs: list[subprocess.Popen] = []
    kept = {ready_r, pipes[0][1], pipes[0][0]}  # kick the ring; keep 0's input open for the last reply
    deadline = time.monotonic() + timeout_s
    try:
        for i in range(segments):
            rfd, wfd = pipes[i][0], pipes[(i + 1) % segments][1]
            args = [sys.executable, __file__, "--worker", str(model), str(bounds[i]), str(bounds[i + 1]), str(threads),
                    str(steps), str(rfd), str(wfd), str(ready_w)]
            procs.append(subprocess.Popen(args, pass_fds=(rfd, wfd, ready_w),
                                          stdout=subprocess.PIPE if i == 0 else None))
        for fd in {ready_w, *(fd for pair in pipes for fd in pair)} - kept:
            os.close(fd)  # only the children hold these: a dead child is EOF, not a hang
        try:
            _read_exact(ready_r, segments, deadline)  # every slice loaded
        except (EOFError, TimeoutError) as exc:
            codes = [p.poll() for p in procs]
            raise SystemExit(f"pipe ring: the slices did not load ({exc}; exit codes {codes})") from exc
        os.write(pipes[0][1], _LEN.pack(4) + (1).to_bytes(4, "little"))
        out = procs[0].stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            if not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise SystemExit("pipe ring: no result before the deadline")
            chunk = os.read(out, 1 << 16)
            if not chunk:
                raise SystemExit(f"pipe ring: process 0 ended early (exit code {procs[0].wait(10)})")
            line += chunk
        stamps = json.loads(line)
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
        for fd in kept:
            os.close(fd)
    rates = []
    for r in range(reps):
        window = stamps[WARMUP + r * tokens:WARMUP + (r + 1) * tokens]
        rates.append((len(window) - 1) / (window[-1] - window[0]))
    return statistics.median(rates)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, start, end, threads, steps, rfd, wfd, ready_fd = sys.argv[2:]
        _worker(model, int(start), int(end), int(threads), int(steps), int(rfd), int(wfd), int(ready_fd))
        return
    from node.models.gguf_meta import read_header

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--segments", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.model:
        model = Path(args.model)
    else:
        from bench.pipeline_bench import default_model

        model = default_model()
    n_layers = read_header(model).n_layers
    one = ring_decode(model, n_layers, 1, args.threads, args.tokens, args.reps)
    split = ring_decode(model, n_layers, args.segments, args.threads, args.tokens, args.reps)
    print(f"model={model.name} threads={args.threads} tokens={args.tokens}")
    print(f"1 process: {one:.1f} tok/s; {args.segments} processes in a pipe ring: {split:.1f} tok/s "
          f"({split / one * 100:.0f}%)")


if __name__ == "__main__":
    main()
