"""llama-cpp-python, imported in one place, with llama.cpp's AMX weight buffers switched off.

llama.cpp built natively on a CPU with AMX (Intel Sapphire Rapids and later) repacks weights
into an AMX "extra buffer type" at load time; on such machines (a 2-vCPU VM here) the first
decode through those buffers segfaults the whole process, with our default model and with
random-weight Q8_0 files alike. With `use_extra_bufts = false` the same files decode correctly.
So when the build reports `AMX_INT8 = 1` every model is loaded without extra buffer types
(this also skips the CPU_REPACK layouts, which costs some llama.cpp speed on those machines, the
price of not crashing). `SWARMLLM_LLAMA_EXTRA_BUFTS=1` turns them back on for a build that is
known to be fine; `=0` turns them off everywhere.

Import llama_cpp through `load()`, never directly, so the policy is
applied before any model loads. The patch wraps `llama_model_default_params`, the one function
`llama_cpp.Llama` starts its model parameters from.
"""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType

from node.errors import ModelLoadError
from node.logs import kv

log = logging.getLogger(__name__)

_lock = threading.Lock()
_module: ModuleType | None = None
_decision: tuple[bool, str] | None = None  # (extra buffer types on, why)


def _build_has_amx(llama_cpp: ModuleType) -> bool:
    try:
        info = llama_cpp.llama_print_system_info()
    except Exception:  # an old binding without it: assume a plain build
        return False
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
    return "AMX_INT8 = 1" in text


def _decide(llama_cpp: ModuleType) -> tuple[bool, str]:
    forced = os.environ.get("SWARMLLM_LLAMA_EXTRA_BUFTS", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True, "SWARMLLM_LLAMA_EXTRA_BUFTS=1"
    if forced in ("0", "false", "no", "off"):
        return False, "SWARMLLM_LLAMA_EXTRA_BUFTS=0"
    if _build_has_amx(llama_cpp):
        return False, "llama.cpp build uses AMX, whose repacked weight buffers crash on decode"
    return True, "default"


def load() -> ModuleType:
    """The llama_cpp module, with the extra-buffer policy installed (once per process)."""
    global _module, _decision
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        try:
            import llama_cpp
            import llama_cpp.llama_cpp as low
        except ImportError as exc:  # a hard dependency, but say so plainly
            raise ModelLoadError(f"llama-cpp-python is not installed: {exc}") from exc
        use, reason = _decide(llama_cpp)
        if not use:
            original = low.llama_model_default_params

            def default_params():
                params = original()
                params.use_extra_bufts = False
                return params

            default_params.__wrapped__ = original  # type: ignore[attr-defined]
            low.llama_model_default_params = default_params
        _decision = use, reason
        log.info("DIAG: llama.cpp backend %s", kv(extra_buffer_types="on" if use else "off", reason=reason))
        _module = llama_cpp
        return llama_cpp


def decision() -> tuple[bool, str] | None:
    """(whether llama.cpp may use extra (repacked) weight buffers, why); None before load()."""
    return _decision
