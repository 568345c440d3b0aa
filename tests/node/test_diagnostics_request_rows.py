"""A failed request's row in the diagnostics report's `recent requests` says why it failed (2026-12-07):
it said `outcome=error error_type=X` only; the cause was in the log, and in a failures ring that keeps
fewer."""

from __future__ import annotations

import re

import aiohttp
import openai
import pytest

from tests.support.nodes import node_config, running_node

pytestmark = pytest.mark.llama


async def _report(node) -> str:
    url = f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics"
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        return await r.text()


def _section(text: str, title: str) -> str:
    return text.split(f"-- {title} --")[1].split("\n\n")[0]


async def test_a_failed_requests_row_says_why(tmp_path, monkeypatch):
    """A model whose load fails (its GGUF names a tokenizer llama.cpp does not know): the request's
    500 and its cause are on its row in `recent requests`, as in the failures section."""
    import gguf

    from node.inference.synth import write_gguf
    from tests.support.nodes import TINY

    add = gguf.GGUFWriter.add_tokenizer_model
    monkeypatch.setattr(gguf.GGUFWriter, "add_tokenizer_model", lambda w, _m: add(w, "zebratok"))
    model = write_gguf(tmp_path / "broken.gguf", TINY)
    monkeypatch.undo()
    async with running_node(node_config(tmp_path / "data", model)) as node:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)
        try:
            with pytest.raises(openai.APIStatusError) as failed:
                await client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=2)
        finally:
            await client.close()
        text = await _report(node)
    status = failed.value.status_code
    assert status >= 500, failed.value
    rows = [line for line in _section(text, "recent requests").splitlines() if "outcome=error" in line]
    assert len(rows) == 1, text
    assert re.search(rf"  error: status={status} \w+: .*zebratok", rows[0]), rows[0]
