"""Logging set-up: verbosity flags, a rotating node.log in the data dir, a TRACE level.

Conventions (seed 000): diagnostic lines start with `DIAG:` and carry `key=value` fields.
Per-message network events log at DEBUG (seen with -v); failures stay at INFO/WARNING.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-5s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"
LOG_FILE_NAME = "node.log"
LOG_FILE_MAX_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 3

_HANDLER_TAG = "_swarmllm_handler"


def level_for_verbosity(verbosity: int) -> int:
    """0 → INFO, 1 (-v) → DEBUG, 2 (-vv) → DEBUG incl. per-message, 3+ (-vvv) → TRACE."""
    if verbosity <= 0:
        return logging.INFO
    if verbosity <= 2:
        return logging.DEBUG
    return TRACE


def setup_logging(verbosity: int = 0, data_dir: Path | None = None, *, stderr: bool = True) -> Path | None:
    """Install the node's handlers on the root logger (idempotent). Returns the log file path."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_TAG, False):
            root.removeHandler(handler)
            handler.close()
    level = level_for_verbosity(verbosity)
    root.setLevel(level)
    formatter = logging.Formatter(LOG_FORMAT, DATE_FORMAT)
    if stderr:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(formatter)
        setattr(console, _HANDLER_TAG, True)
        root.addHandler(console)
    log_path = None
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        log_path = data_dir / LOG_FILE_NAME
        file_handler = logging.handlers.RotatingFileHandler(
            log_path, maxBytes=LOG_FILE_MAX_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8"
        )
        file_handler.setFormatter(formatter)
        setattr(file_handler, _HANDLER_TAG, True)
        root.addHandler(file_handler)
    # Third-party chatter stays at WARNING unless -vvv.
    for noisy in ("aiohttp.access", "zeroconf", "asyncio", "urllib3", "httpx", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbosity >= 3 else logging.WARNING)
    return log_path


def kv(**fields: object) -> str:
    """Render `key=value` pairs for a DIAG line, skipping None (absent means not measured)."""
    parts = []
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.1f}"
        parts.append(f"{key}={value}")
    return " ".join(parts)
