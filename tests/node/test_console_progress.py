"""The console's progress bar (node/logs.ConsoleHandler): on a terminal, progress records redraw
one line in place and other lines clear it first; on a pipe and in node.log only the progress
records marked as lines are written."""

from __future__ import annotations

import io
import logging

from node.logs import LOG_FORMAT, ConsoleHandler, _progress_lines_only, progress_extra


def _record(msg: str, extra: dict | None = None) -> logging.LogRecord:
    r = logging.LogRecord("node.x", logging.INFO, __file__, 1, msg, None, None)
    for k, v in (extra or {}).items():
        setattr(r, k, v)
    return r


def test_a_terminal_gets_one_bar_redrawn_in_place():
    out = io.StringIO()
    h = ConsoleHandler(out, tty=True)
    h.setFormatter(logging.Formatter(LOG_FORMAT))
    h.handle(_record("DIAG: fetching layers", progress_extra("fetching layers 2-4 of m", 1_000_000, 4_000_000,
                                                             line=True)))
    h.handle(_record("DIAG: fetching layers", progress_extra("fetching layers 2-4 of m", 2_000_000, 4_000_000,
                                                             line=False)))
    h.handle(_record("DIAG: something else"))
    h.handle(_record("DIAG: fetching layers", progress_extra("fetching layers 2-4 of m", 4_000_000, 4_000_000,
                                                             line=True)))
    text = out.getvalue()
    frames = text.split("\r")
    assert frames[1].startswith("fetching layers 2-4 of m  [######..................]  25%  1.0 / 4.0 MB")
    assert "50%  2.0 / 4.0 MB" in frames[2] and "\n" not in frames[2]  # in place: no new line
    assert frames[3].strip() == "" and len(frames[3]) >= len(frames[2].rstrip())  # the bar cleared...
    assert frames[4].endswith("DIAG: something else\n")  # ...before the line
    assert frames[5] == "fetching layers 2-4 of m  [########################] 100%  4.0 / 4.0 MB\n"
    assert "DIAG: fetching layers" not in text  # the bar stands for those lines


def test_the_bar_uses_no_escape_sequences_and_covers_a_longer_line():
    """Windows' console (conhost) prints an escape sequence as `←[K` unless the program turns
    them on: the bar draws with `\r` and spaces only, a shorter redraw covering the longer one."""
    out = io.StringIO()
    h = ConsoleHandler(out, tty=True)
    h.setFormatter(logging.Formatter("%(message)s"))
    h.handle(_record("p", progress_extra("a long label for the first stage", 1, 4, line=False)))
    h.handle(_record("p", progress_extra("short", 2, 4, line=False)))
    h.handle(_record("DIAG: other"))
    text = out.getvalue()
    assert "\033" not in text, repr(text)
    first, second, clear = text.split("\r")[1:4]
    assert len(second) == len(first) and second.rstrip().startswith("short")  # nothing of the first left
    assert clear == " " * len(first)


def test_the_rate_and_time_left_once_it_moves():
    h = ConsoleHandler(io.StringIO(), tty=True)
    h.bar("x", 0, 10_000_000, now=100.0)
    text = h.bar("x", 5_000_000, 10_000_000, now=102.0)
    assert text.endswith("50%  5.0 / 10.0 MB  2.5 MB/s  0:02 left"), text


def test_a_pipe_and_the_log_file_get_lines_not_bars():
    out = io.StringIO()
    h = ConsoleHandler(out, tty=False)
    h.setFormatter(logging.Formatter("%(message)s"))
    h.handle(_record("DIAG: fetching layers percent=25", progress_extra("l", 1, 4, line=True)))
    h.handle(_record("DIAG: fetching layers percent=50", progress_extra("l", 2, 4, line=False)))
    h.handle(_record("DIAG: other"))
    assert out.getvalue() == "DIAG: fetching layers percent=25\nDIAG: other\n"
    assert _progress_lines_only(_record("a", progress_extra("l", 1, 4, line=True)))
    assert not _progress_lines_only(_record("a", progress_extra("l", 2, 4, line=False)))
    assert _progress_lines_only(_record("a"))
