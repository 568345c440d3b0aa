"""The Requests tab and /api/admin/requests for a request whose n choices went different ways."""

from __future__ import annotations

import pytest

from app.ui.requests_model import RequestsModel
from app.ui.requests_tab import RequestsTab
from tests.inference.test_choices_routes import _finished

pytestmark = pytest.mark.gui


async def test_the_json_view_and_the_apps_route_say_the_choices_went_different_ways(qapp):
    """Review r71: the Requests tab read "distributed, 2 segment(s), assembled 2×" with choice 0's
    segments, a retry choice 0 never had, and /api/admin/requests had no word of choice 1's route."""
    trace = await _finished([[["me000000", "bbbbbbbb"]], [["me000000", "bbbbbbbb"], ["me000000", "dddddddd"]]])
    assert trace.as_dict()["choice_routes"] == [{"route": "distributed", "nodes": ["me000000", "bbbbbbbb"]},
                                                {"route": "distributed", "nodes": ["me000000", "dddddddd"]}]
    model = RequestsModel()
    model.on_trace_event("started", trace)
    model.on_trace_event("finished", trace)
    tab = RequestsTab(model)
    tab.select(trace.request_id)
    title = tab.detail_title.text()
    assert "different ways" in title and "me000000, dddddddd" in title, title
    assert "the first choice's 2 segment(s)" in title and "every choice's tries" in title, title
