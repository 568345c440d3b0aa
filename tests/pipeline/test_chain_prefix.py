"""Prefix KV reuse across a conversation's turns on a 3-segment chain on 127.0.0.1.

Node a (layers 0-1) coordinates with prefix reuse on (the default); node d holds nothing and
coordinates the same chain with `kv_cache_seqs = 0` (no reuse). Node c keeps little KV
(`slice_kv_budget_mb = 0.15`: one session of up to 512 positions, 0.125 MB there in f16, not two), so a
second long conversation pushes the first one's kept session out there. Every reply must be llama.cpp's greedy text for the whole
conversation on the whole file, whether the turn resumed kept sessions or prefilled in full."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.pipeline.swarm import chain3_and_a_coordinator, llama_greedy, run, split_model
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

N = 16


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("chainprefix")
    model = split_model(base)
    (base / "c").mkdir()
    (base / "c" / "config.toml").write_text('[inference]\nslice_kv_budget_mb = 0.15\nslice_kv_dtype = "f16"\n')
    with chain3_and_a_coordinator(base, model, "[inference]\nkv_cache_seqs = 0\n") as swarm:
        yield {"model": model, **swarm}


def _client(proc: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.base + "/v1", api_key=proc.api_key, max_retries=0, timeout=120)


def _turn(proc: NodeProcess, model_id: str, messages: list[dict]) -> tuple[str, int, dict]:
    raw = _client(proc).chat.completions.with_raw_response.create(
        model=model_id, messages=messages, max_tokens=N, temperature=0)
    resp = raw.parse()
    assert raw.headers["x-swarm-route"] == "distributed" and raw.headers["x-swarm-segments"] == "3"
    details = resp.usage.prompt_tokens_details
    return resp.choices[0].message.content, details.cached_tokens if details else 0, dict(raw.headers)


def _conversation(swarm, proc: NodeProcess, opener: str, turns: int):
    """Each turn's (text, cached_tokens, prompt_tokens), checked against llama.cpp's greedy text."""
    messages: list[dict] = []
    out = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"{opener} (turn {i + 1})" if i == 0 else f"and then {i}?"})
        text, cached, _ = _turn(proc, swarm["model_id"], messages)
        assert text == llama_greedy(swarm["model"], messages, N), (opener, i)
        messages.append({"role": "assistant", "content": text})
        out.append((text, cached))
    return out


def _stats(proc: NodeProcess) -> dict:
    status, body = proc.get("/api/admin/stats")
    assert status == 200, body
    return json.loads(body)


def _log_count(proc: NodeProcess, pattern: str) -> int:
    return len(re.findall(pattern, proc.node_log()))


def test_later_turns_resume_the_kept_sessions_and_give_the_same_text(swarm):
    a, b, c, d = swarm["nodes"]
    hits_before = _log_count(a, r"DIAG: KV-cache HIT .*route=chain")
    on = _conversation(swarm, a, "tell me about the swarm", 3)

    def kept_once_everywhere():  # each turn consumed the previous one's: one kept per segment
        return all(_stats(p)["kv_sessions"] == 0 and _stats(p)["kv_kept"] == 1 for p in (a, b, c))
    run(wait_until(kept_once_everywhere, 30, 0.1, "the last turn's sessions to be kept on every segment"))
    off = _conversation(swarm, d, "tell me about the swarm", 3)
    assert [t for t, _ in on] == [t for t, _ in off]  # a hit gives a miss's text
    assert on[0][1] == 0 and all(cached >= 16 for _, cached in on[1:]), on
    assert all(cached == 0 for _, cached in off), off
    assert _log_count(a, r"DIAG: KV-cache HIT .*route=chain") == hits_before + 2
    assert _log_count(a, r"DIAG: KV session resumed from a kept one") == 2  # a's own segment, at -vv
    assert _stats(d)["kv_kept"] == 0 and _stats(b)["kv_kept"] == 1  # d kept nothing
    assert "chain prefix reuse: hits=" in a.get("/api/admin/diagnostics")[1].decode()


def test_a_shared_system_prompt_is_copied_and_the_first_conversation_still_resumes(swarm):
    """Conversation B starts with conversation A's system prompt (less than half of A's kept
    tokens): its first turn copies that prefix on every segment; A's own next turn then resumes
    A's kept session whole. Every reply is llama.cpp's greedy text."""
    a = swarm["nodes"][0]
    model_id = swarm["model_id"]
    system = {"role": "system", "content": "You are the swarm's helpful assistant; answer in one short line."}
    # A's kept session must stay within 256 positions (c's budget holds two of those, not one of
    # 512 beside a copy) and hold more than twice the shared prefix (else B would resume it)
    conv_a = [system, {"role": "user", "content": "describe the weather over the mountains this week " * 3}]
    resp = _client(a).chat.completions.create(model=model_id, messages=conv_a, max_tokens=N, temperature=0)
    text_a, prompt_a = resp.choices[0].message.content, resp.usage.prompt_tokens
    assert text_a == llama_greedy(swarm["model"], conv_a, N)
    assert prompt_a + N <= 256, prompt_a
    copies_before = _log_count(a, r"DIAG: KV-cache HIT .*route=chain.*copied_from=")
    conv_b = [system, {"role": "user", "content": "and the sea?"}]
    text_b, cached_b, _ = _turn(a, model_id, conv_b)
    assert text_b == llama_greedy(swarm["model"], conv_b, N)
    assert 16 <= cached_b and 2 * cached_b < prompt_a + N - 1, (cached_b, prompt_a)  # a copy, not a resume
    assert _log_count(a, r"DIAG: KV-cache HIT .*route=chain.*copied_from=") == copies_before + 1
    assert _log_count(a, r"DIAG: KV session copied from a kept one") >= 1  # a's own segment, at -vv
    follow = [*conv_a, {"role": "assistant", "content": text_a}, {"role": "user", "content": "and next week?"}]
    text, cached, _ = _turn(a, model_id, follow)
    assert text == llama_greedy(swarm["model"], follow, N)
    assert cached >= prompt_a, (cached, prompt_a)  # A's whole first turn: its kept session stayed whole
    assert "copies=1" in a.get("/api/admin/diagnostics")[1].decode()


def test_a_kept_session_evicted_on_a_segment_falls_back_to_a_full_prefill(swarm):
    a, _, c, _ = swarm["nodes"]
    model_id = swarm["model_id"]
    first = [{"role": "user", "content": "a first long conversation " * 12}]  # > 256 positions
    text1, _, _ = _turn(a, model_id, first)
    second = [{"role": "user", "content": "a second one, pushing the first out of c " * 8}]
    _turn(a, model_id, second)

    def evicted_on_c():
        return _log_count(c, r"KV-cache session evicted .*reason=memory_pressure.*kept=True") >= 1
    run(wait_until(evicted_on_c, 30, 0.1, "c to evict the first conversation's kept session"))
    gone = r"KV-cache MISS — kept session gone on a segment.*reason=evicted_on_segment"
    gone_before = _log_count(a, gone)  # (a first turn copying an earlier test's evicted session)
    follow = [*first, {"role": "assistant", "content": text1}, {"role": "user", "content": "go on"}]
    text, cached, _ = _turn(a, model_id, follow)
    assert text == llama_greedy(swarm["model"], follow, N)
    assert cached == 0  # the resumed attempt failed on c: this one prefilled in full
    assert _log_count(a, gone) == gone_before + 1
    stats = _stats(c)
    assert stats["kv_sessions"] == 0 and stats["kv_mb"] <= 0.3
