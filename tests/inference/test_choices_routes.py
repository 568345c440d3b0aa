"""A request with `n` choices whose choices went different ways (one failed over to another peer):
its summary line (the log's `DIAG: request complete`, the diagnostics report's row) gave choice 0's
route, nodes and segment times alone, and no retry of a later choice (2026-12-07). Now it says
`route=mixed`, every choice's nodes, `choice_routes=` each one's, and counts every choice's retries.

The choices are stand-in runs that route as the pipeline does (`end_assembly` with the segments it
chose, `note_failure` on a failed attempt); the gathering, the TraceHub and the line are the real ones."""

from __future__ import annotations

from node.diagnostics import _request_row
from node.inference.choices import ChoicesRun
from node.inference.request import CompletionRequest, Delta
from node.inference.sampling import SamplingParams
from node.logs import kv
from node.redact import Redactor
from node.trace import RequestTrace, SegmentTrace, TraceHub


class RoutedRun:
    """A choice's run: its routes (one per attempt, the last one serving), a token, then done."""

    def __init__(self, trace: RequestTrace, routes: list[list[str]]):
        self.trace, self.routes, self.job, self.served, self.seats = trace, routes, None, None, 1

    async def prepare(self) -> None:
        for i, nodes in enumerate(self.routes):
            started = self.trace.begin_assembly()
            self.trace.route = "local" if nodes == ["me000000"] else "distributed"
            self.trace.end_assembly(started, [SegmentTrace(n, 0, 6, "local" if n == "me000000" else "direct")
                                              for n in nodes])
            if i < len(self.routes) - 1:
                self.trace.note_failure("link_drop", f"link to {nodes[-1]} dropped")

    async def deltas(self):
        self.trace.mark_token()
        yield Delta(text="x")

    async def close(self) -> None:
        pass

    def abort(self, error) -> None:
        pass


def _request(n: int) -> CompletionRequest:
    return CompletionRequest(kind="chat", model="m", stream=False, include_usage=False, params=SamplingParams(seed=1),
                             messages=({"role": "user", "content": "hi"},), n=n)


async def _finished(routes: list[list[list[str]]]) -> RequestTrace:
    hub = TraceHub()
    trace = hub.start(RequestTrace(model="m", operation="chat.completions"))
    plans = iter(routes)
    run = ChoicesRun(_request(len(routes)), trace, lambda _req, scratch: RoutedRun(scratch, next(plans)))
    await run.prepare()
    async for _ in run.deltas():
        pass
    await run.close()
    hub.finish(trace, "ok")
    return trace


async def _line(routes: list[list[list[str]]]) -> str:
    return (await _finished(routes)).summary_line(public=True)


async def test_choices_that_went_different_ways_say_so():
    # choice 0 through b; choice 1 through b, then (b dropped) failed over to d
    line = await _line([[["me000000", "bbbbbbbb"]], [["me000000", "bbbbbbbb"], ["me000000", "dddddddd"]]])
    assert " route=mixed " in line and " segments=" not in line and "seg0_ms=" not in line, line
    assert " nodes=me000000,bbbbbbbb,dddddddd " in line, line
    assert " " + kv(choice_routes="distributed:me000000,bbbbbbbb|distributed:me000000,dddddddd") + " " in line, line
    assert " assemblies=2 " in line, line  # choice 1's retry


async def test_the_reports_row_names_a_later_choices_failed_attempt():
    trace = await _finished([[["me000000", "bbbbbbbb"]], [["me000000", "bbbbbbbb"], ["me000000", "dddddddd"]]])
    row = _request_row(trace, Redactor(enabled=True))
    assert row.startswith(trace.summary_line(public=True)) and row.endswith(" failed_over=link_drop"), row


async def test_choices_that_went_one_way_read_as_one_route():
    line = await _line([[["me000000", "bbbbbbbb"]], [["me000000", "bbbbbbbb"]], [["me000000", "bbbbbbbb"]]])
    assert " route=distributed segments=2 " in line and "choice_routes" not in line, line
    assert " nodes=me000000,bbbbbbbb " in line and "assemblies" not in line, line

