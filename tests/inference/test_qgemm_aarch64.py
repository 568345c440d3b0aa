"""qgemm's portable loop on another CPU: built for aarch64 (where torch has no fbgemm and this loop is
what int8 slices run on) and run under qemu-user, it computes the exact integer product of every
shape of `aarch64/qgemm_check.c`, with the compiler's NEON multiply-accumulates. Skipped without a
cross compiler and qemu (`.ci/run` installs gcc-aarch64-linux-gnu, its libc and qemu-user)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
KERNEL_DIR = HERE.parents[1] / "node" / "inference" / "weights"
CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CC and QEMU), reason="no aarch64 cross compiler or qemu-aarch64 here")]


def _compile(*extra: str) -> None:
    """The flags setup.py gives the extension, without its Python module (QGEMM_NO_PYTHON)."""
    cmd = [CC, "-O3", "-ffp-contract=off", "-fopenmp", "-DQGEMM_NO_PYTHON", f"-I{KERNEL_DIR}",
           str(HERE / "aarch64" / "qgemm_check.c"), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stderr[-3000:]}"


def test_the_portable_loop_on_aarch64_is_exact_and_vectorized(tmp_path):
    exe = tmp_path / "qgemm_check"
    _compile("-static", "-o", str(exe), "-lm")  # static: qemu-user needs no aarch64 sysroot then
    out = subprocess.run([QEMU, str(exe)], capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert lines[-1] == "all exact" and len(lines) == 6 * 6 * 2 + 6 + 1
    assert all(line.startswith("isa=c ") and line.endswith("mismatches=0") for line in lines[:-1])
    asm = tmp_path / "qgemm.s"
    _compile("-S", "-o", str(asm))
    assert "smlal" in asm.read_text() or "sdot" in asm.read_text()  # the loop became NEON, not scalar
