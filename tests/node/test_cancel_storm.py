"""An editor's autocomplete under a cancel storm: Continue / llama.vscode / Twinny send a completion
per keystroke (/v1/completions with a suffix, llama-server's /infill, or chat) and close the previous
connection when the next starts, 10-100 ms later, while a chat app streams alongside. Real node on
127.0.0.1, a tiny random FIM llama, aiohttp clients whose tasks are cancelled mid-request.

Every aborted request frees its sequence, slot and trace; the chat alongside gives its greedy text
unchanged; a burst's last request gets the text it gets alone; a request after the storm is admitted
at once; the log has at most one INFO line per aborted request."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random

import aiohttp
import pytest
import pytest_asyncio

from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

MAX_CONCURRENT = 2
FIM = dataclasses.replace(TINY, fim=True, name="tiny-fim", n_ctx=512)
CODE = ["def add(a, b):\n    ", "import os\n\ndef walk(root):\n    for ", "class Point:\n    def __init__(self, x"]
SUFFIX = "\n    return total\n"
STORM = int(os.environ.get("CANCEL_STORM_N", "90"))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("storm")
    model = tiny_model(base, FIM, name="fim.gguf")
    async with running_node(node_config(base / "data", model, max_concurrent=MAX_CONCURRENT)) as n:
        yield n


def _body(kind: str, model: str, i: int, max_tokens: int) -> tuple[str, dict]:
    prefix = CODE[i % len(CODE)] + "x" * (i % 7)  # each keystroke adds to the code
    if kind == "infill":
        return "/infill", {"input_prefix": prefix, "input_suffix": SUFFIX, "n_predict": max_tokens,
                           "temperature": 0, "stream": i % 2 == 0}
    if kind == "fim":
        return "/v1/completions", {"model": model, "prompt": prefix, "suffix": SUFFIX, "max_tokens": max_tokens,
                                   "temperature": 0, "stream": i % 2 == 1}
    return "/v1/chat/completions", {"model": model, "max_tokens": max_tokens, "temperature": 0,
                                    "messages": [{"role": "user", "content": "complete: " + prefix}],
                                    "stream": i % 2 == 0}


async def _post(session: aiohttp.ClientSession, node, path: str, body: dict) -> tuple[int, str, dict]:
    """(status, the text, the headers) of a request read to its end (SSE joined)."""
    async with session.post(f"http://127.0.0.1:{node.api.port}{path}", json=body,
                            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        raw = await r.text()
        if not body.get("stream"):
            data = json.loads(raw)
            return r.status, _text(data), {k.lower(): v for k, v in r.headers.items()}
        text = ""
        for line in raw.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += _text(json.loads(line[6:]))
        return r.status, text, {k.lower(): v for k, v in r.headers.items()}


def _text(data: dict) -> str:
    if "content" in data:  # llama-server's /infill
        return data["content"]
    out = ""
    for c in data.get("choices") or []:
        out += c.get("text") or (c.get("message") or {}).get("content") or (c.get("delta") or {}).get("content") or ""
    return out


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


async def test_a_cancel_storm_frees_everything_and_disturbs_nobody(node):
    served = node.models.all()[0]
    model = served.id
    kinds = ("infill", "fim", "chat")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # the references, alone
        chat_body = {"model": model, "max_tokens": 200, "temperature": 0, "stream": True,
                     "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}
        _, chat_alone, _ = await _post(session, node, "/v1/chat/completions", chat_body)
        lasts = [_body(kinds[b % 3], model, 1000 + b, 16) for b in range(6)]
        alone = [(await _post(session, node, p, b))[1] for p, b in lasts]
        fds = len(os.listdir("/proc/self/fd"))

        # a real failure before the storm: the storm's cancels must not push it out of the report's ring
        status, _, headers = await _post(session, node, "/v1/completions", {"model": model, "prompt": "x " * 600})
        assert status == 400
        failed = headers["x-request-id"]

        handler, root = _Lines(), logging.getLogger("node")
        level = root.level
        root.setLevel(logging.INFO)
        root.addHandler(handler)
        started = node.traces.counts["started"]
        rng = random.Random(7)
        try:
            storming = True

            async def chat_app() -> list[tuple[int, str]]:  # streams one reply after another all along
                replies = []
                while storming or not replies:
                    status, text, _ = await _post(session, node, "/v1/chat/completions", chat_body)
                    replies.append((status, text))
                return replies
            chat = asyncio.ensure_future(chat_app())
            aborted = 0
            burst_results = []
            for b in range(6):
                for i in range(STORM // 6):
                    path, body = _body(kinds[(b + i) % 3], model, b * 100 + i, 400)
                    task = asyncio.ensure_future(_post(session, node, path, body))
                    await asyncio.sleep(rng.uniform(0.01, 0.1))  # the next keystroke
                    if not task.done():
                        aborted += 1
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                burst_results.append(await _post(session, node, *lasts[b]))  # the pause: this one is read
            storming = False
            chats = await chat
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
        assert len(chats) > 1 and all(c == (200, chat_alone) for c in chats), (len(chats), chats[:2])
        assert [t for _, t, _ in burst_results] == alone and all(s == 200 for s, _, _ in burst_results)

        # everything comes back
        batcher = served.engine.batcher
        await wait_until(lambda: node.traces.in_flight == 0, 20, 0.02, "no request in flight")
        await wait_until(lambda: batcher.active == 0 and served.lock.holders == 0 and served.waiting == 0
                         and not served.busy and not served.running, 20, 0.02, "the model to be idle")
        assert len(os.listdir("/proc/self/fd")) <= fds + 4
        cancelled = node.traces.counts["cancelled"]
        assert cancelled >= aborted // 2, (cancelled, aborted)
        # a request after the storm is admitted at once
        status, _, headers = await _post(session, node, *lasts[0])
        assert status == 200
        queue = float(headers["server-timing"].split("queue;dur=")[1].split(",")[0])
        assert queue < 50, headers["server-timing"]

    # the log: each cancelled request has its one summary line (INFO, outcome=cancelled), nothing more
    lines = [r.getMessage() for r in handler.records if r.levelno >= logging.INFO and r.name != "node.watchdog"]
    gone = [t.request_id for t in node.traces.recent if t.outcome == "cancelled"]
    assert gone
    for rid in gone:
        said = [m for m in lines if rid in m]
        assert len(said) == 1 and "DIAG: request complete" in said[0] and "outcome=cancelled" in said[0], said
    assert not [r for r in handler.records if r.levelno >= logging.WARNING and r.name != "node.watchdog"]
    assert [t.request_id for t in node.traces.failures] == [failed]  # cancels are no failures
    assert node.traces.counts["started"] - started >= STORM
