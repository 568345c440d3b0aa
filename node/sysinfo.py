"""What this machine is: CPU, cores, RAM, GPU, and a measured memory bandwidth.

Everything here is blocking; the node calls it from an executor once and caches the result.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from node.torch_import import import_torch

log = logging.getLogger(__name__)

BANDWIDTH_BUFFER_BYTES = 128 * 1024 * 1024
BANDWIDTH_REPEATS = 5


@dataclass
class GpuInfo:
    """One accelerator as torch reports it, without its free memory (`free_mb` None): reading that
    (torch.cuda.mem_get_info) makes a CUDA context on the GPU, hundreds of MB of VRAM held from then
    on by a node that may never load a model; a load reads it (inference.devices)."""

    name: str
    total_mb: int
    free_mb: int | None
    compute_capability: str


@dataclass
class MachineInfo:
    """A snapshot of the machine for diagnostics, HELLO and placement."""

    cpu: str
    physical_cores: int
    logical_cores: int
    ram_total_mb: int
    ram_available_mb: int
    os: str
    python: str
    gpus: list[GpuInfo] = field(default_factory=list)
    cpu_features: list[str] = field(default_factory=list)  # the SIMD extensions kernels choose by
    mem_bandwidth_gbps: float | None = None  # None = could not be measured
    bandwidth_error: str | None = None

    def as_dict(self) -> dict:
        """JSON-ready view."""
        return asdict(self)

    @property
    def advertised_speed(self) -> str:
        """What peers rank this node on: bandwidth-derived for a CPU node."""
        if self.gpus:
            return f"gpu {self.gpus[0].name}"
        if self.mem_bandwidth_gbps is None:
            return "unknown (bandwidth could not be measured)"
        return f"cpu {self.mem_bandwidth_gbps:.1f} GB/s"


def cpu_name() -> str:
    """The CPU model name (Linux /proc/cpuinfo, else platform)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
              "amx_int8", "asimd", "asimddp", "i8mm", "sve")  # x86 and ARM flags as /proc/cpuinfo names them


def cpu_features() -> list[str]:
    """The SIMD extensions this CPU reports (Linux /proc/cpuinfo), in SIMD_FLAGS order; [] elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in SIMD_FLAGS if f in have]
    except OSError:
        pass
    return []


def gpu_driver_present() -> bool:
    """Whether a GPU torch could use may be here, asked without importing torch (1.5 s and ~180 MB
    that a node serving through llama.cpp or the swarm never needs: 2026-12-07). Linux: an NVIDIA
    driver (its GPU list, or the control device a container is given), ROCm's /dev/kfd, WSL's
    /dev/dxg; macOS has no CUDA; elsewhere (Windows) only torch can tell: True."""
    if sys.platform == "darwin":
        return False
    if not sys.platform.startswith("linux"):
        return True
    try:
        if any(Path("/proc/driver/nvidia/gpus").iterdir()):
            return True
    except OSError:
        pass
    # (and Jetson's nvgpu, which has neither of NVIDIA's desktop driver files: review r73)
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg", "/dev/nvhost-ctrl-gpu",
                                          "/sys/module/nvgpu"))


def gpu_inventory() -> list[GpuInfo]:
    """CUDA devices via torch (empty without torch or CUDA): name, total memory and compute
    capability from the device's properties (cudaGetDeviceProperties: no CUDA context), never its
    free memory (2026-12-07 review: torch.cuda.mem_get_info here made a context on every GPU at
    every start, a CPU-only node's too). No GPU driver here (`gpu_driver_present`): empty, torch not
    imported."""
    if not gpu_driver_present():
        return []
    try:
        torch = import_torch()
    except Exception:  # torch missing or broken: no GPU we can use
        return []
    gpus = []
    try:
        if not torch.cuda.is_available():
            return []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(GpuInfo(props.name, props.total_memory // 2**20, None, f"{props.major}.{props.minor}"))
    except Exception as exc:  # a broken driver is reported as no GPU, with the reason logged
        log.warning("GPU inventory failed: %s", exc)
    return gpus


def measure_memory_bandwidth(buffer_bytes: int = BANDWIDTH_BUFFER_BYTES,
                             repeats: int = BANDWIDTH_REPEATS) -> float:
    """Best-of-N copy bandwidth in GB/s (read + write bytes counted), via numpy."""
    import numpy as np

    src = np.ones(buffer_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault pages in
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * buffer_bytes / best / 1e9


def ram_available_bytes() -> int:
    """RAM available now (blocking: reads the OS; run it in an executor)."""
    return int(psutil.virtual_memory().available)


def collect(measure_bandwidth: bool = True, gpus: bool = True) -> MachineInfo:
    """Gather the machine snapshot (blocking: run in an executor); `gpus` False (a CPU-only node):
    CUDA is not asked at all."""
    vm = psutil.virtual_memory()
    info = MachineInfo(
        cpu=cpu_name(),
        physical_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        logical_cores=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        ram_total_mb=vm.total // 2**20,
        ram_available_mb=vm.available // 2**20,
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        gpus=gpu_inventory() if gpus else [],
        cpu_features=cpu_features(),
    )
    if measure_bandwidth:
        try:
            info.mem_bandwidth_gbps = round(measure_memory_bandwidth(), 1)
        except Exception as exc:  # MemoryError, numpy missing...: say so, never a fake number
            info.bandwidth_error = str(exc) or type(exc).__name__
            log.warning("memory bandwidth could not be measured: %s", info.bandwidth_error)
    return info


def host_names() -> list[str]:
    """This machine's host name and FQDN (blocking: the FQDN may need a DNS lookup)."""
    import socket

    return sorted({socket.gethostname(), socket.getfqdn()} - {"", "localhost"})


def user_names() -> list[str]:
    """The user's login, home folder's name and full name, with the full name also as a file name
    writes it (`Ana Garcia`, `ana-garcia`, `ana.garcia`, `ana_garcia`, `anagarcia`): what the
    diagnostics report redacts. Blocking (the password database may be a network service)."""
    import getpass

    names: set[str] = set()
    try:
        names.add(Path.home().name)
    except RuntimeError:  # no HOME and no passwd entry (an arbitrary-uid container): no folder name
        pass
    try:
        login = getpass.getuser()
        names.add(login)
        import pwd  # POSIX only

        full = pwd.getpwnam(login).pw_gecos.split(",")[0].strip()
    except (ImportError, KeyError, OSError):
        full = ""
    words = full.split()
    if words:
        names.update([full, *(sep.join(words) for sep in ("-", ".", "_", ""))])
    return sorted(n for n in names if n)
