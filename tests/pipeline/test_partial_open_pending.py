"""An open of a `--model URL` that outlasted the start's wait and then failed in an unexpected way
(a full disk, a folder in the way) is said and ends; it ended silently before, and readiness and
diagnostics said "waiting for its origin" for the rest of the run (found in review). Two spellings
of one URL are opened once (they would write one directory at once). Real origin, real files."""

from __future__ import annotations

from node.inference.pipeline.partials import PartialModels
from tests.support.nodes import tiny_model
from tests.support.rangeserver import ThreadedOrigin


async def test_an_open_failing_after_the_start_is_said_and_not_left_waiting(tmp_path):
    data = tiny_model(tmp_path).read_bytes()
    (tmp_path / "models").write_text("a file where the models folder should be")
    notes: list[str] = []
    partials = PartialModels(tmp_path / "models", note=notes.append)
    opened = []

    async def on_open(directory):
        opened.append(directory)

    with ThreadedOrigin(data, name="m.gguf") as origin:
        dirs, later, pending = await partials.async_open_all([origin.url, origin.url + "#again"], later_ok=True,
                                                             wait_s=0)
        assert (dirs, later) == (set(), []) and list(pending) == [origin.url]  # one open for one directory
        assert origin.url in partials.opening
        await partials.async_open_pending(origin.url, pending[origin.url], on_open)
    assert partials.opening == {} and opened == []
    assert any("could not be opened" in n and "Not a directory" in n for n in notes), notes
