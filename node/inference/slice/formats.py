"""What a slice's load resolves first: its weight format, KV dtype and int8 kernel, and the name
the weight cache keys that kernel's parts by. Pure functions of the request and this machine
(the kernel choice measures once, see `weights/kernels.py`)."""

from __future__ import annotations

import logging

import torch

from node import const
from node.errors import ModelLoadError
from node.inference.arch.block import _KV16
from node.inference.weights.cache import WeightCache
from node.inference.weights.kernels import KERNELS as INT8_KERNELS
from node.inference.weights.kernels import choose_int8_kernel
from node.inference.weights.linear import LAYOUT_VERSION as FBGEMM_LAYOUT_VERSION
from node.inference.weights.linear import fbgemm_available, int8_available
from node.inference.weights.qgemm import LAYOUT_VERSION as QGEMM_LAYOUT_VERSION
from node.inference.weights.qgemm import available as qgemm_available

log = logging.getLogger(__name__)

DTYPES = const.SLICE_DTYPES
KV_DTYPES = const.SLICE_KV_DTYPES


def resolve_format(dtype: str, device: torch.device) -> str:
    """The weight format for a requested dtype on a device ("auto": int8 on CPU, f16 on CUDA)."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown slice dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if dtype != "auto":
        if dtype == "int8" and (device.type != "cpu" or not int8_available()):
            raise ModelLoadError(f"dtype int8 needs a CPU with fbgemm or the compiled qgemm kernel "
                                 f"(device {device})")
        return dtype
    if device.type == "cuda":
        return "f16"
    return "int8" if int8_available() else "f32"


def resolve_kv_dtype(kv_dtype: str, device: torch.device) -> torch.dtype:
    """The KV caches' dtype: f16 halves a session's memory (and what a long context's decode reads)
    at the rounding llama.cpp's default f16 cache has; auto is f16 except on a CPU whose build lacks
    the compiled half kernels (torch would convert the whole cache every step there)."""
    if kv_dtype not in KV_DTYPES:
        raise ModelLoadError(f"unknown KV cache dtype {kv_dtype!r} (one of {', '.join(KV_DTYPES)})")
    if kv_dtype == "auto":
        return torch.float16 if device.type != "cpu" or _KV16 else torch.float32
    if kv_dtype == "f16" and device.type == "cpu" and not _KV16:
        log.warning("DIAG: f16 KV caches asked for without the compiled half kernels (an _attend build from "
                    "before them): every decode step converts the whole cache; rebuild, or use f32")
    return torch.float16 if kv_dtype == "f16" else torch.float32


def kv_element_bytes(kv_dtype: str, device: torch.device | None = None) -> int:
    """Bytes per K or V element for `kv_dtype` (budgets and estimates)."""
    return resolve_kv_dtype(kv_dtype, device or torch.device("cpu")).itemsize


def cache_kernel_name(kernel: str) -> str:
    """The kernel as the weight cache's key names it, with its layout version (a part of an older
    layout is another key, never read as this one). fbgemm 2: full 8-bit weights everywhere (1 had
    pair-safe ones on the matrices without the residual pass in prefills, and an "exact" variant)."""
    return f"qgemm{QGEMM_LAYOUT_VERSION}" if kernel == "qgemm" else f"{kernel}{FBGEMM_LAYOUT_VERSION}"


def resolve_kernel(fmt: str, kernel: str | None, width: int, cache: WeightCache | None) -> str:
    """The matrix kernel of a slice in `fmt`: "torch" for the float formats; for int8 the one asked
    for, else the one measured fastest here (remembered beside the weight cache)."""
    if fmt != "int8":
        return "torch"
    if kernel is None:
        remember = cache.root.parent / "int8-kernel.json" if cache is not None and cache.enabled else None
        return choose_int8_kernel(width, remember=remember)
    if kernel not in INT8_KERNELS:
        raise ModelLoadError(f"unknown int8 kernel {kernel!r}; expected one of {', '.join(INT8_KERNELS)}")
    if kernel == "qgemm" and not qgemm_available():
        raise ModelLoadError("int8 kernel qgemm is not installed (its C extension was not built)")
    if kernel == "fbgemm" and not fbgemm_available():
        raise ModelLoadError("int8 kernel fbgemm is not in this torch build (ARM builds lack it)")
    return kernel
