"""Text for table cells: absent figures show as a dash (not measured), never as zero."""

from __future__ import annotations

import time

DASH = "—"

# Why a model runs on the CPU, in words (cpu_placement_reason values, DESIGN.md §7).
PLACEMENT_REASONS = {
    "no_gpu": "no GPU found",
    "configured_cpu_only": "configured CPU-only",
    "not_enough_vram": "not enough graphics memory",
    "gpu_too_old_for_this_build": "GPU too old for this build",
    "gpu_not_supported_by_this_build": "this build has no GPU support",
}

STATE_COLORS = {
    "loaded": "#1f7a3a",
    "ok": "#1f7a3a",
    "connected": "#1f7a3a",
    "loading": "#8a6d00",
    "unloading": "#8a6d00",
    "connecting": "#8a6d00",
    "in flight": "#1d5fa8",
    "failed": "#b3261e",
    "error": "#b3261e",
    "gone": "#6b6b6b",
    "unloaded": "#6b6b6b",
    "cancelled": "#6b6b6b",
    "stalled": "#8a6d00",  # a streaming client that took nothing, cut off (the node's doing)
}


def ms(value: float | None) -> str:
    """Milliseconds: one decimal under 10 ms, whole above."""
    if value is None:
        return DASH
    return f"{value:.1f} ms" if value < 10 else f"{value:,.0f} ms"


def rate(value: float | None) -> str:
    """Tokens per second."""
    return DASH if value is None else f"{value:,.1f}"


def size(n_bytes: int | None) -> str:
    """Bytes as KiB/MiB/GiB."""
    if n_bytes is None:
        return DASH
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return DASH  # unreachable


def mib(value: float | None, decimals: int = 0) -> str:
    """A figure the node gives in MiB (its `*_mb` fields and budgets are 2**20 bytes: `budget_mb`,
    `per_layer_mb`) in `size`'s unit: '1,024 MiB', '5.1 MiB'. The Swarm tab wrote them "MB" beside
    the Models tab's MiB (2026-12-07)."""
    return DASH if value is None else f"{value:,.{decimals}f} MiB"


def clock(unix_time: float | None) -> str:
    """Local wall-clock time of day."""
    return DASH if not unix_time else time.strftime("%H:%M:%S", time.localtime(unix_time))


def ago(unix_time: float | None, now: float | None = None) -> str:
    """'3 s ago', '2 min ago'."""
    if not unix_time:
        return DASH
    delta = max(0.0, (now or time.time()) - unix_time)
    if delta < 60:
        return f"{delta:.0f} s ago"
    if delta < 3600:
        return f"{delta / 60:.0f} min ago"
    return f"{delta / 3600:.1f} h ago"


def placement(device: str | None, reason: str | None) -> tuple[str, str]:
    """(device text, reason text) for the models table (device None: no weights are loaded)."""
    if device is None:
        return DASH, DASH
    dev = device.lower()
    shown = "GPU (CUDA)" if dev == "cuda" else ("GPU" if dev.startswith("gpu") else dev.upper())
    if reason:
        return shown, PLACEMENT_REASONS.get(reason, reason.replace("_", " "))
    return shown, "admitted to the GPU" if dev != "cpu" else DASH


def layers(held: object, total: int | None = None) -> str:
    """A layer range [a, b) shown inclusive, as `--layers` and the diagnostics do: '0–21 of 22'."""
    if isinstance(held, list | tuple) and len(held) == 2 and all(isinstance(x, int) for x in held):
        a, b = held
        suffix = f" of {total}" if total else ""
        return f"{a}–{b - 1}{suffix}" if b > a else f"none{suffix}"
    return DASH
