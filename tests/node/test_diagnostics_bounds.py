"""The diagnostics report cuts every field and row before the redactor reads it, and redacts its rows
off the event loop (review r67, 2026-12-07: a 64 KB run like "a.a.a…" in a load error, quoted from a
GGUF's architecture string or a peer's header, took the redactor 17 s and stalled the loop 50 s)."""

from __future__ import annotations

import getpass
import threading

import gguf
import pytest

from node.diagnostics import REPORT_LINE_MAX_CHARS
from node.inference.synth import write_gguf
from node.redact import Redactor
from node.trace import RequestTrace
from tests.support.nodes import TINY, node_config, running_node
from tests.support.waiting import wait_until

MARK = 40  # room for the cut's own note, "…(+N chars)"


async def test_fields_and_rows_reach_the_redactor_cut_and_rows_are_redacted_off_the_loop(tmp_path, monkeypatch):
    seen: list[tuple[str, bool]] = []  # (the text given to the redactor, whether on the loop's thread)
    text = Redactor.text

    def recording(self, value):
        seen.append((value, threading.current_thread() is threading.main_thread()))
        return text(self, value)

    monkeypatch.setattr(Redactor, "text", recording)
    async with running_node(node_config(tmp_path / "data")) as node:
        hub = node.traces
        trace = hub.start(RequestTrace(model="m", operation="chat.completions"))
        hub.finish(trace, "error", error_type="LoadError",
                   error_message="load failed at 10.1.2.3: arch " + "a." * 32768 + " /home/ana/x.gguf")
        report = await node.async_report(lead=["could not start: peer said " + "a-" * 32768 + " at 10.1.2.3"])
    assert seen
    # the failure's error (shown at 300 characters) reached the redactor cut to twice that
    errors = [value for value, _ in seen if value.startswith("load failed at")]
    assert errors and all(len(value) <= 600 + MARK for value in errors), [len(v) for v in errors]
    # no text the redactor read held a line longer than twice a row's bound
    longest = max(len(line) for value, _ in seen for line in value.split("\n"))
    assert longest <= 2 * REPORT_LINE_MAX_CHARS + MARK, longest
    # the rows and the whole text were redacted off the event loop's thread (the last call: the whole)
    assert not seen[-1][1]
    assert all(not on_loop for value, on_loop in seen if value.startswith("could not start"))
    # and the report still says them, redacted and cut
    assert "10.1.2.3" not in report and "/home/ana" not in report
    # (the cut's last word, here the whole run, is dropped: a piece of a path or a name is no pattern's)
    assert "could not start: peer said…(+" in report and "load failed at <private-ip-" in report
    assert max(len(line) for line in report.splitlines()) <= REPORT_LINE_MAX_CHARS + MARK


@pytest.mark.llama
async def test_a_models_row_with_a_long_architecture_still_says_its_error(tmp_path, monkeypatch):
    """A GGUF's architecture string is the file's word (a peer's header): 64 KB of it filled the
    model's row to its 16384-character cut, and the row lost its `error=` (review r67)."""
    init = gguf.GGUFWriter.__init__
    monkeypatch.setattr(gguf.GGUFWriter, "__init__", lambda w, path, _arch, *a, **k: init(w, path, "a." * 32768, *a, **k))
    model = write_gguf(tmp_path / "odd.gguf", TINY)
    monkeypatch.undo()
    async with running_node(node_config(tmp_path / "data", model)) as node:
        await wait_until(lambda: any(s.error for s in node.models.all()), what="the model's load to fail")
        report = await node.async_report()
    models = report.split("-- models --")[1].split("-- downloads --")[0]
    row = next(line for line in models.splitlines() if " arch=" in line)
    assert " error=" in row and len(row) < 4096, len(row)


async def test_a_models_architecture_is_redacted_before_it_is_made_one_line(tmp_path, monkeypatch):
    """`arch=` was escaped before the row was redacted: `llama\\n10.1.2.3\\tagarcia` kept its address
    and the user's name as `\\n10.1.2.3\\tagarcia`, which no pattern knows (review r70)."""
    init = gguf.GGUFWriter.__init__
    monkeypatch.setattr(gguf.GGUFWriter, "__init__",
                        lambda w, path, _arch, *a, **k: init(w, path, "llama\n10.1.2.3\tagarcia", *a, **k))
    model = write_gguf(tmp_path / "odd.gguf", TINY)
    monkeypatch.undo()
    monkeypatch.setattr(getpass, "getuser", lambda: "agarcia")
    async with running_node(node_config(tmp_path / "data", model)) as node:
        await wait_until(lambda: any(s.error for s in node.models.all()), what="the model's load to fail")
        report = await node.async_report()
    row = next(line for line in report.split("-- models --")[1].splitlines() if " arch=" in line)
    assert "10.1.2.3" not in row and "agarcia" not in row, row
