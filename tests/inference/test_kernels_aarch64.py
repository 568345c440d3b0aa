"""The compiled kernels' portable loops on another CPU: built for aarch64 (where torch has no fbgemm
and these loops are what slices run on) and run under qemu-user.

- qgemm (`aarch64/qgemm_check.c`): the exact integer product of every shape, with the compiler's
  NEON multiply-accumulates;
- attention (`aarch64/attend_check.c`): half caches read by the hardware's conversion give the
  portable conversion's float for every half, and a decode step over them the bits of float32
  caches holding the same values, near a float64 reference, with the conversion vectorized.

Skipped without a cross compiler and qemu (`.ci/run` installs gcc-aarch64-linux-gnu, its libc and
qemu-user). The kernels are built with setup.py's flags, without their Python module."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOURCES = HERE.parents[1] / "node" / "inference"
CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CC and QEMU), reason="no aarch64 cross compiler or qemu-aarch64 here")]


def _compile(harness: str, define: str, include: Path, *extra: str) -> None:
    cmd = [CC, "-O3", "-ffp-contract=off", "-fopenmp", f"-D{define}", f"-I{include}",
           str(HERE / "aarch64" / harness), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stderr[-3000:]}"


def _run(tmp_path: Path, harness: str, define: str, include: Path) -> tuple[list[str], str]:
    """The harness's output lines (it ran to the end, exit 0) and its assembly."""
    exe, asm = tmp_path / "check", tmp_path / "check.s"
    _compile(harness, define, include, "-static", "-o", str(exe), "-lm")  # static: no aarch64 sysroot needed
    out = subprocess.run([QEMU, str(exe)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    _compile(harness, define, include, "-S", "-o", str(asm))
    return out.stdout.strip().splitlines(), asm.read_text()


def test_qgemm_portable_loop_on_aarch64_is_exact_and_vectorized(tmp_path):
    lines, asm = _run(tmp_path, "qgemm_check.c", "QGEMM_NO_PYTHON", SOURCES / "weights")
    assert lines[-1] == "all exact" and len(lines) == 6 * 6 * 2 + 6 + 1
    assert all(line.startswith("isa=c ") and line.endswith("mismatches=0") for line in lines[:-1])
    assert "smlal" in asm or "sdot" in asm  # the loop became NEON, not scalar


def test_attention_portable_loop_on_aarch64_reads_half_caches_exactly(tmp_path):
    lines, asm = _run(tmp_path, "attend_check.c", "ATTEND_NO_PYTHON", SOURCES / "arch")
    assert lines[0] == "halves: 0 of 65536 differ"
    decode = [line for line in lines if line.startswith("decode ")]
    assert len(decode) == 10 and all("same_bits=1" in line for line in decode)
    assert lines[-1] == "isa=c all exact"
    assert "fcvtl" in asm  # half -> float by the vector unit, not bit by bit
