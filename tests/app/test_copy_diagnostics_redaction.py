""""Copy diagnostics" of a node that could not start: its reason leads the report and is redacted
by the report's own redactor (found by a bug hunt, 2026-12-06)."""

from __future__ import annotations

import re

import pytest

from app.host import AppState
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = pytest.mark.gui

UNASSIGNED = "198.51.100.7"  # TEST-NET-2 (redacted as private): on no machine, so binding fails naming it


def test_the_reason_and_the_report_tag_one_address_alike(qtbot, run, data_dir, tiny_model):
    """The reason was redacted by a second redactor with a salt of its own: the address the API
    could not bind showed as two different hosts in one paste (and the reason knew none of the
    configured host names)."""

    async def body():
        async with running_app(node_config(data_dir, tiny_model, host=UNASSIGNED)) as app:
            assert app.host.state == AppState.ERROR and UNASSIGNED in app.host.status_line()
            report = await app.actions.async_copy_diagnostics()
            assert UNASSIGNED not in report
            reason = report.splitlines()[0]
            reachability = next(line for line in report.splitlines() if line.startswith("reachability: "))
            tags = {*re.findall(r"<private-ip-[0-9a-f]{4}>", reason), *re.findall(r"<private-ip-[0-9a-f]{4}>", reachability)}
            assert len(tags) == 1, (reason, reachability)
            full = await app.actions.async_report(full=True)
            assert UNASSIGNED in full.splitlines()[0]

    run(body())
