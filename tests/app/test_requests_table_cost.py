"""A full requests table (its 500 rows, a day of use) must not make every in-flight row's update
re-measure the whole table on the loop the node serves from.

Seen in the desktop app: with 500 finished rows in the Requests table, a single streamed request
decoded at ~40 tok/s instead of ~140 and the Qt/asyncio loop stalled up to 1.6 s (the node's
watchdog logged `network event loop stalled ... arm=app.ui.table_model:refresh`) — even with the
Requests tab hidden. Each dataChanged of one row made both views over the requests model (the
Requests tab and the Overview's recent list, ResizeToContents columns) fit their columns to every
row: 64,000 `data()` calls, 0.2-0.4 s, per in-flight row every 500 ms tick.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import uuid

import openai
import pytest

from app.ui.requests_model import MAX_ROWS
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_updating_one_row_of_a_full_requests_table_is_cheap(qtbot, run, data_dir, tiny_model):
    calls = [0]

    def counting(text):
        def counted(value):
            calls[0] += 1
            return text(value)
        return counted

    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            node, rows = app.node, app.feeds.requests
            client = openai.AsyncOpenAI(base_url=node.api_url, api_key=node.api_key, max_retries=0)
            try:
                await client.chat.completions.create(model="tiny", max_tokens=4,
                                                     messages=[{"role": "user", "content": "hello"}])
            finally:
                await client.close()
            await wait_until(lambda: node.traces.in_flight == 0 and rows.rowCount() == 1, DEADLINE_S,
                             what="the first row")
            finished = rows.values()[0]
            while rows.rowCount() < MAX_ROWS:  # the table's history after a day of requests
                trace = copy.copy(finished)
                trace.request_id = str(uuid.uuid4())
                rows.upsert(trace.request_id, trace)
            app.window.show_tab("Chat")  # not even the Requests tab on screen
            await asyncio.sleep(0.5)
            # count the cells the views read (each DisplayRole read formats one cell)
            rows.columns = [dataclasses.replace(c, text=counting(c.text)) for c in rows.columns]
            calls[0] = 0
            rows.refresh(rows.keys()[0])  # what each in-flight row's tick does, every 500 ms
            await asyncio.sleep(0.3)  # the views handle the change on the loop
            # One row of 9 columns changed: the views may measure the rows they show and some
            # more, not all 500 rows of both of them (8,000 cells read: 64,000 data() calls).
            assert calls[0] < 3_000, f"{calls[0]} cells read for one changed row of {rows.rowCount()}"

    run(body())


def test_a_tick_over_eight_in_flight_rows_measures_the_table_once(qtbot, run, data_dir, long_model):
    """The 500 ms tick refreshed each in-flight row on its own, each a re-measure of the views
    (8 streams: 8 × ~15 ms on the loop per tick, logged as `network event loop stalled …
    arm=app.ui.table_model:refresh`); one change over their rows costs one."""
    calls = [0]

    def counting(text):
        def counted(value):
            calls[0] += 1
            return text(value)
        return counted

    async def body():
        async with running_app(node_config(data_dir, long_model, max_concurrent=8)) as app:  # all 8 decode at once
            node, rows = app.node, app.feeds.requests
            client = openai.AsyncOpenAI(base_url=node.api_url, api_key=node.api_key, max_retries=0)

            async def stream(i: int) -> None:
                chunks = await client.completions.create(model="longgen", prompt=f"def f{i}(", stream=True,
                                                         max_tokens=1000, temperature=0)
                async for _chunk in chunks:
                    pass

            await client.completions.create(model="longgen", prompt="x", max_tokens=2)
            await wait_until(lambda: node.traces.in_flight == 0 and rows.rowCount() == 1, DEADLINE_S,
                             what="the first row")
            finished = rows.values()[0]
            while rows.rowCount() < MAX_ROWS - 8:  # a day's history below the 8 streams
                trace = copy.copy(finished)
                trace.request_id = str(uuid.uuid4())
                rows.upsert(trace.request_id, trace)
            streams = [asyncio.ensure_future(stream(i)) for i in range(8)]
            try:
                await wait_until(lambda: len(rows._in_flight) == 8, DEADLINE_S, what="8 requests in flight")  # noqa: SLF001
                # past their first tokens: no trace event (a row's own refresh) during the count
                await wait_until(lambda: all(t.first_token for t in node.traces.in_flight_traces()), DEADLINE_S,
                                 what="the 8 streams' first tokens")
                rows.columns = [dataclasses.replace(c, text=counting(c.text)) for c in rows.columns]
                calls[0] = 0
                rows._tick()  # noqa: SLF001 - the ticker's slot, as its timer calls it
                await asyncio.sleep(0.3)
                # one re-measure (~1,200 cells read here), not one per in-flight row (~6,500)
                assert calls[0] < 3_000, f"{calls[0]} cells read for one tick over 8 in-flight rows"
            finally:
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                await client.close()

    run(body())
