"""node.log lines are one line each, whatever a client sent (a real `swarmllm run -v` process)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.support.nodes import tiny_model
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

FORGED = "DIAG: request complete request_id=FORGED-ZEBRA outcome=ok"


@pytest.fixture
def proc(tmp_path):
    node = NodeProcess(tmp_path / "data", args=["--model", str(tiny_model(tmp_path)), "--no-default-model",
                                                "--n-threads", "1", "-v"])
    node.wait_ready()
    yield node
    node.terminate()


async def test_a_newline_a_client_sent_cannot_write_a_line_of_its_own_in_node_log(proc):
    """Found hunting the diagnostics (2026-12-06): a Messages request's `context_management` edit
    type is logged at -v with `%s`, so `"a\\nDIAG: request complete …"` wrote a summary line of the
    client's making into node.log: a request that never ran, read as one. Every message is one line
    now (the formatter's, for every log call), the newline escaped as `\\n`."""
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
            "context_management": {"edits": [{"type": f"clear_x\n{FORGED}"}]}}
    async with aiohttp.ClientSession() as s, s.post(proc.base + "/v1/messages", json=body,
                                                    headers=proc.auth) as r:
        assert r.status == 200, await r.text()
    await wait_until(lambda: "context_management requested" in proc.node_log(), what="the -v line")
    log = proc.node_log()
    assert not [ln for ln in log.splitlines() if ln.startswith(FORGED)], log[-2000:]
    [line] = [ln for ln in log.splitlines() if "context_management requested" in ln]
    assert line.endswith(f"edits=clear_x\\n{FORGED}"), line
