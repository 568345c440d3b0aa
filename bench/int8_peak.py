"""qgemm's int8 products on every instruction set this CPU has, against each set's own peak.

    python bench/int8_peak.py [--threads 1]

For each of qgemm's paths (AVX-512 VNNI, AVX-512BW, AVX2 — those this CPU runs) it times the
slice engine's product shapes (a 1B-shaped layer's [2048, 2048], [16384, 2048] and [2048, 8192];
one decode row and a 128-token prefill) and prints G multiply-adds/s per core; then the peak of
the instruction that path is built on, from a register-only loop compiled here with the system's
C compiler (independent accumulators, 8 ymm / 12 zmm; AVX2 and AVX-512BW: vpmaddwd + vpaddd, the
pair those paths of qgemm issue; AVX-512 VNNI: vpdpwssd). The ratio says how much of the instruction's
rate the kernel keeps, i.e. how much a better kernel could still win on that CPU. The CPU's name
heads the output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEAK_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define ACC "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7)
__attribute__((target("avx2"))) static double avx2(long n) {
    __m256i a0 = _mm256_set1_epi16(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256i x = _mm256_set1_epi16(3), y = _mm256_set1_epi16(5);
    double t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile(
            "vpmaddwd %8,%9,%%ymm14\n vpaddd %%ymm14,%0,%0\n vpmaddwd %8,%9,%%ymm15\n vpaddd %%ymm15,%1,%1\n"
            "vpmaddwd %8,%9,%%ymm14\n vpaddd %%ymm14,%2,%2\n vpmaddwd %8,%9,%%ymm15\n vpaddd %%ymm15,%3,%3\n"
            "vpmaddwd %8,%9,%%ymm14\n vpaddd %%ymm14,%4,%4\n vpmaddwd %8,%9,%%ymm15\n vpaddd %%ymm15,%5,%5\n"
            "vpmaddwd %8,%9,%%ymm14\n vpaddd %%ymm14,%6,%6\n vpmaddwd %8,%9,%%ymm15\n vpaddd %%ymm15,%7,%7\n"
            : ACC : "x"(x), "x"(y) : "ymm14", "ymm15");
    return n * 8.0 * 16 / (now() - t);
}
#undef ACC
/* 12 accumulators (an asm takes at most 30 operands): vpdpwssd's latency (5 cycles) over 8 chains
   would cap a CPU with two 512-bit units (Intel Xeons) below its rate */
#define ACC "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), \
            "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11)
#define Z12 __m512i a0 = _mm512_set1_epi16(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, \
                a8 = a0, a9 = a0, a10 = a0, a11 = a0; \
            __m512i x = _mm512_set1_epi16(3), y = _mm512_set1_epi16(5)
#define DP(i) "vpdpwssd %12,%13,%" #i "\n"
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni(long n) {
    Z12;
    double t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile(DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11)
                         : ACC : "v"(x), "v"(y));
    return n * 12.0 * 32 / (now() - t);
}
/* AVX-512BW: vpmaddwd into a temporary, vpaddd into the accumulator (qgemm's avx512 path) */
#define MA(i) "vpmaddwd %12,%13,%%zmm30\n vpaddd %%zmm30,%" #i ",%" #i "\n"
__attribute__((target("avx512f,avx512bw"))) static double bw(long n) {
    Z12;
    double t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile(MA(0) MA(1) MA(2) MA(3) MA(4) MA(5) MA(6) MA(7) MA(8) MA(9) MA(10) MA(11)
                         : ACC : "v"(x), "v"(y) : "zmm30");
    return n * 12.0 * 32 / (now() - t);
}
int main(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) printf("avx2 %.1f\n", avx2(100000000) / 1e9);
    if (__builtin_cpu_supports("avx512bw")) printf("avx512 %.1f\n", bw(50000000) / 1e9);
    if (__builtin_cpu_supports("avx512vnni")) printf("avx512vnni %.1f\n", vnni(50000000) / 1e9);
    return 0;
}
"""


def instruction_peaks() -> dict[str, float]:
    """G multiply-adds/s of one core at each path's instruction ({} without a C compiler)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "peak.c", Path(tmp) / "peak"
        src.write_text(PEAK_C)
        try:
            subprocess.run(["cc", "-O2", str(src), "-o", str(exe)], check=True, capture_output=True)
            out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"instruction peaks not measured ({e})")
            return {}
    return {name: float(v) for name, v in (line.split() for line in out.splitlines())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import numpy as np
    import torch

    from node.inference.weights import qgemm
    from node.sysinfo import cpu_features, cpu_name

    if not qgemm.available():
        print("qgemm is not built here (pip install -e . builds it)")
        return 1
    torch.set_num_threads(args.threads)
    print(f"cpu: {cpu_name()} ({' '.join(cpu_features())}), threads={args.threads}")
    best = qgemm.isa()
    order = ["avx512vnni", "avx512", "avx2"]
    isas = order[order.index(best):] if best in order else []
    rng = np.random.default_rng(0)
    rates: dict[str, list[float]] = {isa: [] for isa in isas}
    for n, k in ((2048, 2048), (16384, 2048), (2048, 8192)):
        q = torch.from_numpy(rng.integers(-127, 128, (n, k), dtype=np.int8))
        lin = qgemm.Int8Packed.from_rows(q, torch.from_numpy(rng.random(n, dtype=np.float32)), None)
        for rows in (1, 128):
            x = torch.randn(rows, k)
            line = []
            for isa in isas:
                qgemm._qgemm.set_isa(isa)
                lin(x)
                reps = 200 if rows == 1 else 8
                t = min(_timed(lin, x, reps) for _ in range(3))
                rate = n * k * rows / t / 1e9 / args.threads
                if rows > 1:
                    rates[isa].append(rate)
                line.append(f"{isa} {rate:6.1f}")
            print(f"[{n:5d}, {k:4d}] x {rows:3d} rows: " + "   ".join(line) + "  G multiply-adds/s per core")
    qgemm._qgemm.set_isa(best)
    peaks = instruction_peaks()
    for isa, vals in rates.items():
        peak = peaks.get(isa)
        if peak:
            print(f"{isa}: prefill products {min(vals):.1f}–{max(vals):.1f} of the instruction's {peak:.1f} "
                  f"(one core, registers only) = {min(vals) / peak:.0%}–{max(vals) / peak:.0%}")
    return 0


def _timed(lin, x, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        lin(x)
    return (time.perf_counter() - t) / reps


if __name__ == "__main__":
    sys.exit(main())
