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
applied before any model loads.

llama.cpp says why a load failed only through its log ("unknown model architecture: 'x'"); the
exception says "Failed to load model from file". `load()` also puts a log callback in front of
llama-cpp-python's own (which still gets every line, so llama.cpp's log is as before), and
`capture_errors()` keeps the error lines one thread's load logs: `load_errors()` gives
their last lines, for the error a user sees (2026-12-06). The patch wraps `llama_model_default_params`, the one function
`llama_cpp.Llama` starts its model parameters from.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Iterator
from types import ModuleType

from node.errors import ModelLoadError
from node.logs import kv

log = logging.getLogger(__name__)

_lock = threading.Lock()
_module: ModuleType | None = None
_decision: tuple[bool, str] | None = None  # (extra buffer types on, why)
_callback = None  # our log callback (kept referenced: llama.cpp holds only its address)
_captured = threading.local()  # .lines: list[str] while capture_errors() runs on this thread

GGML_LOG_ERROR, GGML_LOG_CONT = 4, 5  # ggml_log_level (NONE, DEBUG, INFO, WARN, ERROR, CONT)
LOAD_ERROR_LINES = 3  # the last error lines of a failed load put into its error


def _install_log_capture(llama_cpp: ModuleType) -> None:
    """Our callback before llama-cpp-python's: keeps the capturing thread's error lines."""
    global _callback
    try:
        from llama_cpp import _logger

        passed_on = _logger.llama_log_callback
    except (ImportError, AttributeError):  # another binding layout: leave llama.cpp's log alone
        return

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        try:
            lines = getattr(_captured, "lines", None)
            if lines is not None:
                kept = level == GGML_LOG_ERROR or (level == GGML_LOG_CONT and _captured.kept)
                if level != GGML_LOG_CONT:
                    _captured.kept = kept
                if kept:
                    piece = text.decode("utf-8", "replace")
                    if lines and not lines[-1].endswith("\n"):
                        lines[-1] += piece
                    else:
                        lines.append(piece)
                    del lines[:-50]
        except Exception:  # never raise into C
            pass
        passed_on(level, text, user_data)

    _callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def capture_errors() -> Iterator[list[str]]:
    """Keep the error lines llama.cpp logs on this thread meanwhile (blocking loads)."""
    _captured.lines, _captured.kept = [], False
    try:
        yield _captured.lines
    finally:
        _captured.lines = None


def load_errors(lines: list[str]) -> str:
    """The last captured lines, as one clause for an error message ("" if none)."""
    said = [line.strip() for line in lines if line.strip()]
    said = [line for line in said if "failed to load model" not in line.lower()] or said  # the vague one
    return "; ".join(said[-LOAD_ERROR_LINES:])


def with_cause(message: str, lines: list[str]) -> str:
    """`message`, with what llama.cpp logged about it."""
    cause = load_errors(lines)
    return f"{message} (llama.cpp said: {cause})" if cause else message


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
        _install_log_capture(llama_cpp)
        log.info("DIAG: llama.cpp backend %s", kv(extra_buffer_types="on" if use else "off", reason=reason))
        _module = llama_cpp
        return llama_cpp


def decision() -> tuple[bool, str] | None:
    """(whether llama.cpp may use extra (repacked) weight buffers, why); None before load()."""
    return _decision
