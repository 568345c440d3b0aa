"""Pause contributing, then un-pause, while another contributions change is still under way (a
"Help serve" choosing layers holds the node's contributions lock): the un-pause click was dropped,
since the node's flag had not turned yet ("already contributing"), and the pause ran alone. The
tray then ticked "Pause contributing" again by itself. The user's last click is what the node ends
with now."""

from __future__ import annotations

import pytest

from app.host import AppState
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_unpausing_before_a_pending_pause_ran_leaves_the_node_contributing(qtbot, run, tmp_path, tiny_model):
    async def body():
        async with running_app(node_config(tmp_path / "data", tiny_model)) as app:
            await wait_until(lambda: app.host.state == AppState.SERVING, DEADLINE_S, what="serving")
            contributions = app.node.contributions
            pause = app.tray.pause_action
            async with contributions._lock:  # another change under way (Help serve choosing layers)  # noqa: SLF001
                pause.trigger()  # pause…
                assert pause.isChecked()
                pause.trigger()  # …no, go on contributing
                assert not pause.isChecked()
            changed = []
            unsubscribe = contributions.events.subscribe(lambda: changed.append(contributions.paused))
            try:
                await wait_until(lambda: changed and not contributions._lock.locked(), DEADLINE_S,  # noqa: SLF001
                                 what="the asked changes to run")
                await wait_until(lambda: not contributions.paused and app.host.state == AppState.SERVING
                                 and not pause.isChecked(), 30,
                                 what=f"contributing again (changes seen: {changed}, paused: {contributions.paused})")
            finally:
                unsubscribe()

    run(body())
