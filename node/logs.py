"""Logging set-up: verbosity flags, a rotating node.log in the data dir, a TRACE level, and a
progress bar on a terminal.

Conventions (seed 000): diagnostic lines start with `DIAG:` and carry `key=value` fields.
Levels by verbosity: none → INFO (lifecycle, failures, each request's summary); -v → DEBUG (one
line per request or event: routes, KV-cache HIT/MISS, speculation, dials); -vv → MESSAGE (also one
line per frame or pipeline step: `sent frame`, `LayerForward`, acks); -vvv → TRACE (per layer,
pings, and the libraries' own debug lines).

Progress (`progress_extra`): a record carrying `progress=(label, done, total)` is drawn by the
console handler on a terminal as one bar line, redrawn in place (`\r`, spaces over what is left of
the longer line before: no escape sequence, which Windows' console prints as `←[K` unless a program
turns them on), with the rate and the time left; any other line clears it first (spaces), and the next update draws it again. In node.log, and on a
console that is not a terminal, only the progress records marked `progress_line` are written (a
line every PARTIAL_PROGRESS_LOG_S, and the last), as ordinary DIAG lines.
"""

from __future__ import annotations

import logging
import logging.handlers
import re
import sys
import time
from pathlib import Path
from typing import IO

MESSAGE = 7  # per frame / per pipeline step (-vv)
TRACE = 5  # per layer, pings (-vvv)
logging.addLevelName(MESSAGE, "MSG")
logging.addLevelName(TRACE, "TRACE")

LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)-5s %(name)s: %(message)s"  # UTC (LineFormatter)
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


def utc_clock(unix_time: float) -> str:
    """A time quoted in a message that reaches node.log and the report: UTC marked Z as their stamps
    are, the time of day if it is today (UTC), else the date too (2026-12-07, review r71: local time
    with no zone, hours off the lines beside it for a reader elsewhere)."""
    when = time.gmtime(unix_time)
    return time.strftime("%H:%M:%SZ" if when[:3] == time.gmtime()[:3] else "%Y-%m-%d %H:%MZ", when)
LOG_FILE_NAME = "node.log"
LOG_FILE_MAX_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 3

_HANDLER_TAG = "_swarmllm_handler"


def level_for_verbosity(verbosity: int) -> int:
    """0 → INFO, 1 (-v) → DEBUG, 2 (-vv) → MESSAGE (per frame and step), 3+ (-vvv) → TRACE."""
    if verbosity <= 0:
        return logging.INFO
    if verbosity == 1:
        return logging.DEBUG
    if verbosity == 2:
        return MESSAGE
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
    formatter = LineFormatter(LOG_FORMAT, DATE_FORMAT)
    if stderr:
        console = ConsoleHandler(sys.stderr)
        console.setFormatter(formatter)
        setattr(console, _HANDLER_TAG, True)
        root.addHandler(console)
    log_path = None
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        log_path = data_dir / LOG_FILE_NAME
        file_handler = LogFileHandler(
            log_path, maxBytes=LOG_FILE_MAX_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8"
        )
        file_handler.setFormatter(formatter)
        file_handler.addFilter(_progress_lines_only)
        setattr(file_handler, _HANDLER_TAG, True)
        root.addHandler(file_handler)
    # Third-party chatter stays at WARNING unless -vvv.
    for noisy in ("aiohttp.access", "zeroconf", "asyncio", "urllib3", "httpx", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbosity >= 3 else logging.WARNING)
    return log_path


class LineFormatter(logging.Formatter):
    """Every record's message on one line of its own (`clean_text`, bounded by LOG_MESSAGE_MAX_CHARS);
    a traceback keeps its lines. Lines quoting what a client sent with `%s` (a Messages request's
    context_management edit types, a body's unknown keys) wrote a newline into node.log, and after it
    a `DIAG: request complete` line of the client's making (found 2026-12-06); `kv()` made its own
    values one line, not the rest. Its stamps are UTC, marked Z, as the diagnostics report's
    `generated:`: a log pasted beside a report from another zone read hours off (2026-12-07)."""

    converter = time.gmtime

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        message = record.message
        if len(message) > LOG_MESSAGE_MAX_CHARS or not message.isprintable():
            record.message = clean_text(message, LOG_MESSAGE_MAX_CHARS)
        return super().formatMessage(record)


class LogFileHandler(logging.handlers.RotatingFileHandler):
    """node.log. A line it cannot write (a full disk) is said once on stderr, and again when the file
    takes lines anew, instead of logging's traceback for every line: on a full disk that was some 20
    lines of `--- Logging error ---` per log line, burying the one that named the problem."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._failing = False  # the last write failed (said once)
        self._failed_now = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed_now = False
        super().emit(record)  # (under the handler's lock: the flags need none of their own)
        if self._failing and not self._failed_now:
            self._failing = False
            self._say(f"{self.baseFilename} is written again")

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        if not isinstance(sys.exc_info()[1], OSError):  # a bad log call (its arguments): logging's traceback
            super().handleError(record)
            return
        self._failed_now = True
        if self._failing:
            return
        self._failing = True
        exc = sys.exc_info()[1]
        why = getattr(exc, "strerror", None) or exc
        self._say(f"cannot write {self.baseFilename} ({why}): its lines are lost until it can be written "
                  "again (free some space there)")

    @staticmethod
    def _say(text: str) -> None:
        stamp = time.strftime(DATE_FORMAT, time.gmtime()) + "Z"  # (as the lines beside it: review r71)
        try:
            sys.stderr.write(f"{stamp} WARNING node.logs: {text}\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # no stderr (a windowed app): nothing to say it on
            pass


def progress_extra(label: str, done: int, total: int, *, line: bool) -> dict[str, object]:
    """`extra=` for a progress record: drawn as a bar on a terminal; written as a line (node.log,
    a console that is not a terminal) only when `line`."""
    return {"progress": (label, int(done), int(total)), "progress_line": line}


def _progress_lines_only(record: logging.LogRecord) -> bool:
    return getattr(record, "progress", None) is None or bool(getattr(record, "progress_line", False))


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


class ConsoleHandler(logging.StreamHandler):
    """stderr. On a terminal, progress records draw one bar line in place (see the module doc);
    elsewhere they are lines only when marked so."""

    WIDTH = 24

    def __init__(self, stream: IO[str] | None = None, *, tty: bool | None = None):
        super().__init__(stream if stream is not None else sys.stderr)
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty()) if tty is None else tty
        self._drawn = 0  # how many characters the bar covers on the current line (0: none)
        self._first: dict[str, tuple[float, int]] = {}  # label -> (when, done) at its first update

    def bar(self, label: str, done: int, total: int, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        t0, d0 = self._first.setdefault(label, (now, done))
        if done < d0:  # another stage under the same label (a peer's bytes, then the origin's)
            t0, d0 = self._first[label] = (now, done)
        frac = min(1.0, done / total) if total > 0 else 1.0
        filled = int(frac * self.WIDTH)
        text = f"{label}  [{'#' * filled}{'.' * (self.WIDTH - filled)}] {frac * 100:3.0f}%  {_mb(done)} / {_mb(total)} MB"
        if now - t0 >= 0.5 and done > d0:
            rate = (done - d0) / (now - t0)
            left = (total - done) / rate if rate > 0 else 0.0
            text += f"  {_mb(rate)} MB/s  {int(left) // 60}:{int(left) % 60:02d} left"
        return text

    def emit(self, record: logging.LogRecord) -> None:
        progress = getattr(record, "progress", None)
        if progress is not None and self.tty:
            try:
                label, done, total = progress
                end = done >= total
                line = self.bar(label, done, total)
                self.stream.write("\r" + line + " " * max(0, self._drawn - len(line)) + ("\n" if end else ""))
                self._drawn = 0 if end else max(self._drawn, len(line))  # what the screen shows
                if end:
                    self._first.pop(label, None)
                self.flush()
            except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
                self.handleError(record)
            return
        if progress is not None and not getattr(record, "progress_line", False):
            return
        if self._drawn:
            drawn, self._drawn = self._drawn, 0
            try:
                self.stream.write("\r" + " " * drawn + "\r")
            except Exception:  # noqa: BLE001 - as above
                self.handleError(record)
                return
        super().emit(record)


LOG_MESSAGE_MAX_CHARS = 65536  # a whole log message past this is cut (its values are KV_VALUE_MAX_CHARS each)
KV_VALUE_MAX_CHARS = 4096  # a value past this is cut (`…(+N chars)`): clients' text can be any size (a stuck stop step's await chain fits)


def clean_text(text: str, max_chars: int = KV_VALUE_MAX_CHARS) -> str:
    """`text` on one line (control characters escaped, as `repr` writes them) and at most
    `max_chars` long. For what a client or a peer sent, quoted in a log line or a report: a model
    name with a newline in it forged a `DIAG: request complete` line, one of 200 KB made the
    diagnostics report 610 KB."""
    head = text[:max_chars]
    if not head.isprintable():  # (escaped before the bound: an escape is up to 10 characters)
        head = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in head)
    if len(head) > max_chars or len(text) > max_chars:
        left = len(text) - max_chars
        return f"{head[:max_chars]}…" + (f"(+{left} chars)" if left > 0 else "")
    return head


def cut_for_redaction(text: str, max_chars: int) -> str:
    """`text` cut to twice `max_chars` (what `clean_text(redacted, max_chars)` can show, and room for
    the tags that replace addresses) before a redactor reads it: its patterns never see a field's
    whole length (a 64 KB GGUF string in a load error took seconds; review r67, 2026-12-07). The
    cut goes back to the last line, tab, `, ` or `; ` before it, else to its last space: a piece of
    a path or a name is no longer what a pattern knows, and paths and full names span spaces (review
    r70: cut at the last space, a list of `C:\\Users\\Ana Maria Garcia\\…` paths left `Maria` after
    a `<path>`). The cut is said, as `clean_text` says its own."""
    cap = 2 * max_chars
    if len(text) <= cap:
        return text
    head = text[:cap]
    end = max(head.rfind("\n"), head.rfind("\t"), head.rfind(", "), head.rfind("; "))
    if end <= 0:
        end = head.rfind(" ")
    head = head[:end] if end > 0 else ""
    return f"{head}…(+{len(text) - len(head)} chars)"


_REGION_CODE = re.compile(r"[A-Za-z0-9_-]+")


def region_code(text: str | None, max_chars: int) -> str | None:
    """`text` if it is a region code (letters, digits, `_` and `-`, at most `max_chars`), else None:
    DIAG lines and the report name one region per node with it. A peer's HELLO region is any text:
    `US,EU,TH outcome=ok` read as three regions and a forged field on a summary line's `regions=`
    (review r64); mending it (`US-EU-TH-outcome-ok`) would also unmask an e-mail the redactor hides."""
    if text and len(text) <= max_chars and _REGION_CODE.fullmatch(text):
        return text
    return None


def kv(**fields: object) -> str:
    """Render `key=value` pairs for a DIAG line, skipping None (absent means not measured).
    Values are made one line and bounded (`clean_text`)."""
    parts = []
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.1f}"
        elif not isinstance(value, int):
            value = clean_text(str(value))
        parts.append(f"{key}={value}")
    return " ".join(parts)
