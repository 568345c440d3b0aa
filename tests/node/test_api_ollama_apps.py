"""The apps that speak Ollama's API, replayed against a real node on 127.0.0.1 serving the embedded
default model: each test sends the body the app sends (read from its public source) and reads the
reply as its parser does. Open WebUI (backend/open_webui/routers/ollama.py, utils/payload.py), Zed
(crates/ollama/src/ollama.rs), Continue (core/llm/llms/Ollama.ts), Home Assistant's ollama
integration."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime

import aiohttp
import pytest

from node.api import ollama as ollama_api
from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

node = default_model_node("ollama_apps")


async def call(node, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    """(status, text) of one request, with the key as the apps send it (a Bearer token)."""
    async with aiohttp.ClientSession() as session, session.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", data=None if body is None else json.dumps(body),
            headers={"Authorization": f"Bearer {node.api_key}", "Content-Type": "application/json"}) as resp:
        return resp.status, await resp.text()


async def api_chat(node, model_id: str, messages: list[dict], options: dict, caplog=None) -> tuple[dict, dict | None]:
    """One /api/chat request, not streamed, that must answer 200: its reply, and the numbers of the
    `DIAG: history past the context, oldest messages dropped` line it logged (`dropped`, `kept`,
    `prompt`, `n_ctx`; None: it dropped nothing). Without caplog the line is not read (None)."""
    if caplog is not None:
        caplog.set_level(logging.DEBUG, logger="node.inference.generate")
        first = len(caplog.records)  # this request's lines only
    status, text = await call(node, "POST", "/api/chat", {"model": model_id, "messages": messages, "stream": False,
                                                          "options": options})
    assert status == 200, text
    if caplog is None:
        return json.loads(text), None
    said = [r.getMessage() for r in caplog.records[first:] if "oldest messages dropped" in r.getMessage()]
    return json.loads(text), {k: int(v) for k, v in re.findall(r"\b(\w+)=(\d+)\b", said[-1])} if said else None


def open_webui_name(model: str) -> str:
    """What Open WebUI sends for a model it lists: the name with `:latest` added when it has no tag
    (generate_chat_completion, embed, generate_completion, unload), which it then looks up among the
    `model` names /api/tags gave (get_ollama_url: "Model not found" when missing)."""
    return model if ":" in model else f"{model}:latest"


async def test_open_webui_finds_the_models_it_lists_and_chats(node, model_id):
    status, text = await call(node, "GET", "/api/tags")
    assert status == 200
    listed = {m["model"]: m for m in json.loads(text)["models"]}  # merge_ollama_models_lists
    ui_id = next(iter(listed))  # the id the user picks in the model menu
    sent = open_webui_name(ui_id)
    assert sent in listed, (sent, list(listed))
    # convert_payload_openai_to_ollama: the UI's params as options, keep_alive lifted out, the stop list
    body = {"model": sent, "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "What does os.path.join do?"}],
            "stream": True, "keep_alive": "5m", "metadata": {"chat_id": "c1"},
            "options": {"temperature": 0.0, "num_ctx": 2048, "num_predict": 8, "stop": ["\n\n"]}}
    status, text = await call(node, "POST", "/api/chat", body)
    assert status == 200, text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert lines[-1]["done"] is True and "".join(p["message"]["content"] for p in lines)
    # RAG with Ollama's embeddings, and the admin's unload button: the same lookup
    status, text = await call(node, "POST", "/api/embed", {"model": open_webui_name(ui_id), "input": ["a", "b"]})
    assert status == 200 and len(json.loads(text)["embeddings"]) == 2
    status, text = await call(node, "POST", "/api/generate", {"model": sent, "keep_alive": 0, "prompt": ""})
    assert status == 200 and json.loads(text)["done_reason"] == "unload"
    # get_all_models marks loaded models by /api/ps' `model`, parsing expires_at with fromisoformat
    status, text = await call(node, "GET", "/api/ps")
    running = json.loads(text)["models"]
    assert [m["model"] for m in running] == [ui_id]
    assert int(datetime.fromisoformat(running[0]["expires_at"]).timestamp()) > 0
    assert listed[ui_id]["name"] == ui_id and ui_id.split(":")[0] == model_id


def continue_parameters(text: str) -> dict[str, str]:
    """Continue's reading of /api/show's `parameters` (Ollama.ts ensureModelInfo): one
    `key value` per line, matched by this pattern; `num_ctx` becomes its context length."""
    out = {}
    for line in text.split("\n"):
        parts = re.match(r'^(\S+)\s+((?:".*")|\S+)$', line)
        if parts:
            out[parts[1]] = parts[2]
    return out


async def test_continue_reads_the_nodes_context_from_parameters(node, model_id):
    status, text = await call(node, "POST", "/api/show", {"name": model_id})
    assert status == 200
    shown = json.loads(text)
    n_ctx = node.models.get(model_id).n_ctx
    assert int(continue_parameters(shown["parameters"])["num_ctx"]) == n_ctx  # else it assumes 8192
    arch = shown["model_info"]["general.architecture"]  # Zed and others read <arch>.context_length
    assert shown["model_info"][f"{arch}.context_length"] == n_ctx
    assert [k for k in shown["model_info"] if k.endswith(".context_length")] == [f"{arch}.context_length"]


async def test_bare_tool_results_answer_the_calls_in_their_order():
    """Continue and Home Assistant send a tool's result as `{"role": "tool", "content"}` only, one per
    call in the calls' order; Ollama renders them so. Two calls in one turn were a 400 here."""
    history = ollama_api._history([
        {"role": "user", "content": "weather in Paris and London?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {"city": "London"}}}]},
        {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "noon"}])
    assert [m.get("tool_call_id") for m in history[2:]] == ["call_1_0", "call_1_1"]


async def test_continue_agent_turn_with_two_tool_results(node, model_id):
    """Continue's _streamChat body after two calls in one turn: calls without ids, bare results,
    its options (num_ctx, use_mmap, num_thread dropped) and keep_alive in seconds."""
    tool = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                             "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                            "required": ["path"]}}}
    messages = [{"role": "user", "content": "Compare a.py and b.py"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "read_file", "arguments": {"path": "a.py"}}},
                    {"function": {"name": "read_file", "arguments": {"path": "b.py"}}}]},
                {"role": "tool", "content": "x = 1"}, {"role": "tool", "content": "x = 2"},
                {"role": "user", "content": "Which is larger?"}]
    body = {"model": model_id, "messages": messages, "tools": [tool], "keep_alive": 1800, "stream": True,
            "options": {"temperature": 0, "num_predict": 4, "num_ctx": 8192, "num_thread": 4, "use_mmap": True}}
    status, text = await call(node, "POST", "/api/chat", body)
    assert status == 200, text
    assert json.loads(text.splitlines()[-1])["done"] is True


async def test_zed_chat_body_with_its_nulls(node, model_id):
    """Zed serialises every Option: `think`, the options it leaves unset and an assistant's
    `tool_calls`/`thinking` go out as null, `tools` as [] and keep_alive as -1; its serde reads
    each NDJSON line as {model, created_at, message: {role, content}, done}."""
    body = {"model": f"{model_id}:latest", "stream": True, "keep_alive": -1, "tools": [], "think": None,
            "options": {"num_ctx": 4096, "num_predict": 6, "stop": None, "temperature": None, "top_p": None},
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "Hello", "tool_calls": None, "thinking": None},
                         {"role": "user", "content": "What does os.path.join do?"}]}
    status, text = await call(node, "POST", "/api/chat", body)
    assert status == 200, text
    for line in text.splitlines():
        piece = json.loads(line)
        assert isinstance(piece["model"], str) and isinstance(piece["created_at"], str)
        assert piece["message"]["role"] == "assistant" and isinstance(piece["message"]["content"], str)
    assert piece["done"] is True and isinstance(piece["eval_count"], int)


def long_chat(turns: int) -> list[dict]:
    """A system message, then `turns` user/assistant exchanges, then the question: past 1024 tokens."""
    out = [{"role": "system", "content": "You answer questions about Python's standard library."}]
    for i in range(turns):
        out += [{"role": "user", "content": f"Question {i}: what does os.path.join do with several parts?"},
                {"role": "assistant", "content": f"Answer {i}: it joins the parts with the separator, in order."}]
    return [*out, {"role": "user", "content": "What does os.path.join do?"}]


async def test_a_chat_past_the_context_drops_its_oldest_messages_as_ollama_does(node, model_id, caplog):
    """Open WebUI sends a long chat whole; Ollama drops its oldest messages (keeping the system
    message and the last one) until it fits. /v1 still answers a 400, as OpenAI does."""
    n_ctx = node.models.get(model_id).n_ctx
    chat = long_chat(40)
    greedy = {"temperature": 0, "num_predict": 4}
    status, text = await call(node, "POST", "/v1/chat/completions", {"model": model_id, "messages": chat, "max_tokens": 4})
    assert status == 400 and "context" in text
    reply, said = await api_chat(node, model_id, chat, greedy, caplog)
    assert 0 < reply["prompt_eval_count"] < n_ctx
    dropped = said["dropped"]
    assert dropped % 2 == 0 and 0 < dropped < len(chat) - 2  # whole exchanges: the kept history opens with a user
    kept = [chat[0], *chat[1 + dropped:]]  # the system message, and the newest messages to the last
    same, _ = await api_chat(node, model_id, kept, greedy)
    assert same["prompt_eval_count"] == reply["prompt_eval_count"]
    assert same["message"]["content"] == reply["message"]["content"]
    assert reply["prompt_eval_count"] + greedy["num_predict"] <= n_ctx  # room for the reply asked (review r46)
    one_more = [chat[0], *chat[1 + dropped - 2:]]  # the fewest dropped: one exchange more leaves no such room
    status, text = await call(node, "POST", "/v1/chat/completions", {"model": model_id, "messages": one_more,
                                                                     "max_tokens": 1})
    assert (status == 400 and "context" in text) or \
        json.loads(text)["usage"]["prompt_tokens"] + greedy["num_predict"] > n_ctx, text


async def test_a_trimmed_chat_leaves_its_reply_the_room_it_asks(node, model_id):
    """Review r46: the cut left room for one token, so a trimmed chat's reply stopped at whatever
    room the cut happened to leave ("length" after 1..50 tokens, whatever num_predict said)."""
    n_ctx = node.models.get(model_id).n_ctx
    for num_predict in (40, None):
        options = {"temperature": 0, **({"num_predict": num_predict} if num_predict else {})}
        reply, _ = await api_chat(node, model_id, long_chat(40), options)
        assert reply["prompt_eval_count"] + (num_predict or n_ctx // 4) <= n_ctx, reply


def agent_loop(calls: int) -> list[dict]:
    """Continue's agent mode / Home Assistant: one user message (the task), then calls and their
    results, the last message a tool result: past the context."""
    out = [{"role": "system", "content": "You edit Python files."},
           {"role": "user", "content": "Rename the function join_paths to join in every module."}]
    for i in range(calls):
        out += [{"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": f"pkg/m{i}.py"}}}]},
                {"role": "tool", "tool_name": "read_file",
                 "content": f"# module {i}\n" + "def join_paths(a, b):\n    return os.path.join(a, b)\n" * 3}]
    return out


async def test_an_agent_loop_past_the_context_keeps_its_task_and_its_latest_calls(node, model_id, caplog):
    """Review r46: with one user message and then calls and results, the only cut at a user message
    was the last message: the task and every call were dropped, the last tool result alone left. The
    loop is cut before a call (its result kept with it), the task kept before it."""
    loop = agent_loop(30)
    greedy = {"temperature": 0, "num_predict": 8}
    reply, said = await api_chat(node, model_id, loop, greedy, caplog)
    dropped, kept = said["dropped"], said["kept"]
    assert dropped % 2 == 0 and dropped > 0 and kept == len(loop) - dropped, said  # whole call/result pairs
    assert kept >= 4, said  # system, task, at least one call and its result
    fitted = [loop[0], loop[1], *loop[2 + dropped:]]
    assert fitted[2]["role"] == "assistant" and fitted[2]["tool_calls"] and fitted[-1] == loop[-1]
    assert (await api_chat(node, model_id, fitted, greedy))[0]["message"] == reply["message"]


async def test_the_listed_latest_name_works_on_the_v1_routes_too(node, model_id):
    """GitHub Copilot Chat's Ollama connection reads the names /api/tags lists (`<id>:latest`) and
    chats on <base>/v1 with them: every /v1 route answered 404 for the tagged name (review r46)."""
    status, text = await call(node, "GET", "/api/tags")
    [listed] = [m["name"] for m in json.loads(text)["models"] if m["name"].startswith(model_id)]
    assert listed == f"{model_id}:latest"
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
                       ("/v1/completions", {"prompt": "import os", "max_tokens": 2}),
                       ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
                       ("/v1/embeddings", {"input": "import os"})):
        status, text = await call(node, "POST", path, {"model": listed, **body})
        assert status == 200, (path, text)
    status, text = await call(node, "POST", "/v1/chat/completions",
                              {"model": f"{model_id}:q4", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404, text  # (another tag is another model: not this one on /v1)
    status, text = await call(node, "GET", f"/v1/models/{listed}")  # (review r47: a 404)
    assert status == 200 and json.loads(text)["id"] == model_id, text
    status, text = await call(node, "POST", "/v1/chat/completions", {"model": "nosuch:latest", "max_tokens": 2,
                                                                     "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and "`nosuch:latest`" in text, text  # named as sent (it said `nosuch`)


async def _prompt_tokens(node, model_id, messages) -> int | None:
    """The prompt's tokens on /v1 (None: past the context there)."""
    status, text = await call(node, "POST", "/v1/chat/completions", {"model": model_id, "messages": messages,
                                                                     "max_tokens": 1})
    return json.loads(text)["usage"]["prompt_tokens"] if status == 200 else None


async def test_a_chat_just_under_the_context_is_fitted_for_its_reply_too(node, model_id, caplog):
    """Review r47: a chat a token under the context was served as it was, its reply cut to the one
    token left ("length"), where one token more would have been trimmed with room for it."""
    n_ctx = node.models.get(model_id).n_ctx
    turns = 1
    while (n := await _prompt_tokens(node, model_id, long_chat(turns + 1))) is not None and n <= n_ctx - 200:
        turns += 1
    turns += 1  # the first chat past n_ctx - 200 (or past the context: then the one before it)
    if await _prompt_tokens(node, model_id, long_chat(turns)) is None:
        turns -= 1
    assert (await _prompt_tokens(node, model_id, long_chat(turns))) is not None, "no chat just under the context"
    reply, said = await api_chat(node, model_id, long_chat(turns), {"temperature": 0, "num_predict": 200}, caplog)
    assert reply["prompt_eval_count"] + 200 <= n_ctx
    assert said is not None


async def test_an_agent_loop_of_a_later_task_keeps_that_task_not_the_first(node, model_id, caplog):
    """Review r47: old task, reply, new task, then a long loop: the fitted history kept the OLD task
    and dropped the one the calls were working on."""
    loop = agent_loop(30)
    chat = [loop[0], {"role": "user", "content": "OLD TASK: write a poem about paths."},
            {"role": "assistant", "content": "Paths join, parts align."}, *loop[1:]]  # loop[1]: the new task
    greedy = {"temperature": 0, "num_predict": 8}
    reply, said = await api_chat(node, model_id, chat, greedy, caplog)
    fitted = [chat[0], chat[3], *chat[4 + said["dropped"] - 2:]]  # the old task and its reply dropped, then call pairs
    assert fitted[2]["role"] == "assistant" and fitted[2]["tool_calls"], said
    assert (await api_chat(node, model_id, fitted, greedy))[0]["prompt_eval_count"] == reply["prompt_eval_count"]


async def test_a_loop_whose_task_leaves_no_room_for_a_call_is_the_contexts_400_not_a_lone_tool_result(node, model_id):
    """Review r47: a task of most of the context, then calls: the history was cut to the last tool
    result alone (Qwen3's template: "No user query found in messages"); now the context's 400."""
    n_ctx = node.models.get(model_id).n_ctx
    loop = agent_loop(6)
    big = "Rename join_paths to join in this file:\n" + "def join_paths(a, b):\n    return os.path.join(a, b)\n" * 40
    loop[1] = {"role": "user", "content": big}
    assert (await _prompt_tokens(node, model_id, [loop[0], loop[1]])) > n_ctx * 3 // 4  # (the task alone)
    status, text = await call(node, "POST", "/api/chat", {"model": model_id, "messages": loop, "stream": False,
                                                          "options": {"temperature": 0, "num_predict": 8}})
    assert status == 400 and "context" in text, text


LONG_QUESTION = "Explain this file line by line:\n" + "def join_paths(a, b):\n    return os.path.join(a, b)\n" * 31


async def test_a_chat_within_the_context_keeps_its_history_when_no_cut_leaves_room(node, model_id, caplog):
    """Review r48: a chat within the context whose last message is long (a pasted file) lost every
    earlier message, no cut leaving the reply its room anyway: it is served whole."""
    n_ctx = node.models.get(model_id).n_ctx
    chat = [{"role": "system", "content": "You answer questions about Python."},
            {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": LONG_QUESTION}]
    whole = await _prompt_tokens(node, model_id, chat)
    alone = await _prompt_tokens(node, model_id, [chat[0], chat[3]])
    assert whole is not None and alone + n_ctx // 4 > n_ctx, (whole, alone)  # no cut leaves a quarter
    reply, said = await api_chat(node, model_id, chat, {"temperature": 0, "num_predict": 300}, caplog)
    assert reply["prompt_eval_count"] == whole
    assert said is None


async def test_a_prefill_past_the_context_keeps_its_question(node, model_id, caplog):
    """Review r48: an assistant prefill as the last message was kept alone with the system message,
    its question dropped: the model continued a reply to nothing."""
    chat = [*long_chat(40)[:-1], {"role": "user", "content": LONG_QUESTION},
            {"role": "assistant", "content": "It joins"}]  # (the question and prefill leave no quarter)
    assert await _prompt_tokens(node, model_id, chat) is None  # past the context
    _, said = await api_chat(node, model_id, chat, {"temperature": 0, "num_predict": 300}, caplog)
    fitted = [chat[0], *chat[1 + said["dropped"]:]]
    assert fitted[1]["role"] == "user" and fitted[-2:] == chat[-2:], said


async def test_a_loop_continued_by_a_prefill_is_cut_before_a_call(node, model_id, caplog):
    """Review r49: a prefill after a loop's results ("continue the reply") made the task the last
    unit, no call cut was left, and the chat was the context's 400."""
    chat = [*agent_loop(30), {"role": "assistant", "content": "I renamed"}]
    _, said = await api_chat(node, model_id, chat, {"temperature": 0, "num_predict": 8}, caplog)
    dropped = said["dropped"]
    fitted = [chat[0], chat[1], *chat[2 + dropped:]]  # the task, then whole call/result pairs, the prefill
    assert dropped > 0 and fitted[2]["tool_calls"] and fitted[-1] == chat[-1], said


@pytest.mark.parametrize("turns", [40, 5])
async def test_when_no_cut_leaves_all_the_room_the_reply_still_gets_half(node, model_id, turns):
    """Review r49: when no cut left the reply its quarter of the context, the earliest cut leaving
    one token was taken (past the context), or the chat served whole (within it): replies of 4-18
    tokens, "length", whatever num_predict said. Now half the room asked, or what the question alone
    leaves."""
    n_ctx = node.models.get(model_id).n_ctx
    chat = [*long_chat(turns)[:-1], {"role": "user", "content": LONG_QUESTION}]
    alone = await _prompt_tokens(node, model_id, [chat[0], chat[-1]])
    floor = min(n_ctx // 4 // 2, n_ctx - alone)
    reply, _ = await api_chat(node, model_id, chat, {"temperature": 0, "num_predict": 300})
    assert reply["prompt_eval_count"] + floor <= n_ctx, (reply, floor)


async def test_a_loop_ending_in_a_big_tool_result_gets_half_its_room_too(node, model_id):
    """Review r50: a loop whose last message is a large tool result had no measured floor (only a
    user turn's was), and was served whole with 13 tokens left for the reply."""
    n_ctx = node.models.get(model_id).n_ctx
    loop = agent_loop(2)
    loop[-1] = {**loop[-1], "content": "# module 1\n" + "def join_paths(a, b):\n    return os.path.join(a, b)\n" * 33}
    async def tokens(messages):  # (Ollama's call shapes: /api/chat, one token asked, so nothing is cut)
        status, text = await call(node, "POST", "/api/chat", {"model": model_id, "messages": messages,
                                                              "stream": False, "options": {"num_predict": 1}})
        return json.loads(text)["prompt_eval_count"] if status == 200 else None
    smallest = await tokens([loop[0], loop[1], *loop[-2:]])
    whole = await tokens(loop)
    assert whole is not None and whole + n_ctx // 8 > n_ctx >= smallest + n_ctx // 8, (whole, smallest)
    reply, _ = await api_chat(node, model_id, loop, {"temperature": 0, "num_predict": 300})
    assert reply["prompt_eval_count"] + n_ctx // 8 <= n_ctx, reply
