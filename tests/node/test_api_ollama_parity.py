"""Where Ollama's dialect (api/ollama.py, api/ollama_models.py) answers as Ollama itself does
(server/routes.go, api/types.go), driven by the official `ollama` client against a real node on
127.0.0.1 serving the embedded default model: an option's 400 names it as sent, options Ollama
accepts are accepted, `think` on a model that does not think, an unknown model's 404 and the `:tag`
rule shared with /v1."""

from __future__ import annotations

import logging

import httpx
import ollama
import pytest

from node.api import ollama as ollama_api
from node.inference.synth import SynthSpec
from node.inference.tools.deepseek_r1 import MARKERS as R1_MARKERS
from tests.support.nodes import default_model_node, ollama_client, template, tiny_models_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "hi"}]

node = default_model_node("ollama_parity")
# models that think: DeepSeek-R1's template (think tags), gpt-oss's (harmony channels, efforts)
THINKER = SynthSpec(n_ctx=2048, think=True, control_tokens=R1_MARKERS,
                    chat_template=template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), name="thinker")
GPTOSS = SynthSpec(n_ctx=2048, harmony=True, chat_template=template("openai-gpt-oss-120b"), name="gptoss")
thinkers = tiny_models_node(THINKER, GPTOSS)
# models whose template takes a thinking switch (reasoning_effort) with no think tags to split
SWITCHED = [SynthSpec(n_ctx=2048, chat_template=template(name), name=name.split("-")[0].lower())
            for name in ("tencent-Hy3", "upstage-Solar-Open-100B")]
switched = tiny_models_node(*SWITCHED)


@pytest.fixture
def client(node):
    return ollama_client(node)


async def _post(node, path: str, body: dict) -> tuple[int, dict]:
    """(status, JSON) of one POST on the node's API."""
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"http://127.0.0.1:{node.api.port}{path}", json=body,
                               headers={"Authorization": f"Bearer {node.api_key}"})
        return resp.status_code, resp.json()


async def _refused(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as info:
        await call
    return info.value


@pytest.mark.parametrize(("option", "value"), [("temperature", 5), ("top_p", 2), ("seed", "x"), ("stop", 5),
                                               ("top_k", "x")])
async def test_a_bad_option_is_named_as_sent(client, model_id, option, value):
    """An option's 400 named the /v1 field (`temperature`), which the client's request does not have."""
    for call in (client.chat(model=model_id, messages=QUESTION, options={option: value}),
                 client.generate(model=model_id, prompt="hi", options={option: value}),
                 client.generate(model=model_id, prompt="hi", raw=True, options={option: value})):
        error = await _refused(call)
        assert error.status_code == 400 and error.error.startswith(f"`options.{option}` must be"), error.error


async def test_think_on_a_model_that_does_not_think_is_ollamas_400(client, model_id):
    """Ollama answers 400 `"<model>" does not support thinking` (routes.go); it was taken silently."""
    assert "thinking" not in (await client.show(model_id)).capabilities
    for think in (True, "high", "max"):  # "max": Ollama's since April 2026 ("high"), was "must be ..."
        for call in (client.chat(model=f"{model_id}:latest", messages=QUESTION, think=think),
                     client.generate(model=f"{model_id}:latest", prompt="hi", think=think)):
            error = await _refused(call)
            assert error.status_code == 400 and error.error == f'"{model_id}:latest" does not support thinking'
    for think in (False, None):  # off: taken, as by Ollama
        reply = await client.chat(model=model_id, messages=QUESTION, think=think, options={"num_predict": 2})
        assert reply.done


async def test_think_on_models_that_think_is_taken(thinkers):
    client = ollama_client(thinkers)
    for served in thinkers.models.all():  # gpt-oss's channels are thinking too (it was left out)
        assert "thinking" in (await client.show(served.id)).capabilities, served.id
        think = "high" if "gptoss" in served.id else True
        reply = await client.chat(model=served.id, messages=QUESTION, think=think, options={"num_predict": 4})
        assert reply.done, served.id
        reply = await client.generate(model=served.id, prompt="hi", think=think, options={"num_predict": 4})
        assert reply.done, served.id
    gptoss = next(s.id for s in thinkers.models.all() if "gptoss" in s.id)
    greedy = {"temperature": 0, "num_predict": 6}
    high = await client.chat(model=gptoss, messages=QUESTION, think="high", options=greedy)
    most = await client.chat(model=gptoss, messages=QUESTION, think="max", options=greedy)  # Ollama's "max": "high"
    assert (most.message.content, most.message.thinking) == (high.message.content, high.message.thinking)
    assert (await client.generate(model=gptoss, prompt="hi", think="max", options=greedy)).done


async def test_think_on_models_whose_template_takes_a_switch_is_taken(switched):
    """Tencent Hy3's and Upstage Solar Open's templates read `reasoning_effort` only: an effort reaches
    them (it was a 400 "does not support thinking", review r52: there are no think tags to split), but
    `think: true` sets `enable_thinking`, which they never read — taken, it changed nothing (review r56):
    Ollama's 400, as for any model that does not think. An effort the template refuses (Hy3: "medium")
    is a 400 about the effort, not "the messages". Not listed as thinking, as on Ollama."""
    client = ollama_client(switched)
    for served in switched.models.all():
        assert "thinking" not in (await client.show(served.id)).capabilities, served.id
        plain = await client.generate(model=served.id, prompt="hi", options={"num_predict": 1})
        for think in ("high", "low"):
            reply = await client.chat(model=served.id, messages=QUESTION, think=think, options={"num_predict": 3})
            assert reply.done, (served.id, think)
        low = await client.generate(model=served.id, prompt="hi", think="low", options={"num_predict": 1})
        assert low.prompt_eval_count != plain.prompt_eval_count, served.id  # the template took it (not its default)
        with pytest.raises(ollama.ResponseError) as err:
            await client.chat(model=served.id, messages=QUESTION, think=True, options={"num_predict": 3})
        assert err.value.status_code == 400 and "does not support thinking" in err.value.error, served.id
    hy3 = next(m for m in switched.models.all() if "tencent" in m.id)
    with pytest.raises(ollama.ResponseError) as err:
        await client.chat(model=hy3.id, messages=QUESTION, think="medium", options={"num_predict": 3})
    assert err.value.status_code == 400 and "refused the reasoning effort" in err.value.error, err.value.error


# Open WebUI's Advanced Params, set away from their defaults (typical_p, mirostat and its rates, tfs_z,
# a longer penalty window): Ollama takes them all (api/types.go, or "invalid option provided": a warning)
NOT_APPLIED = {"typical_p": 0.9, "mirostat": 2, "mirostat_eta": 0.2, "mirostat_tau": 4.0, "tfs_z": 0.5,
               "repeat_last_n": 128}
# ... and at the values its "Custom" button puts in: they would change nothing anywhere
AT_DEFAULTS = {"typical_p": 1.0, "mirostat": 0, "mirostat_eta": 0.1, "mirostat_tau": 5.0, "tfs_z": 1,
               "repeat_last_n": 64}


async def test_options_ollama_takes_are_taken_and_said_once(client, model_id, caplog, monkeypatch):
    """They were 400s (`typical_p` is not supported...), so every chat of an app that set one failed."""
    monkeypatch.setattr(ollama_api, "_told_not_applied", set(), raising=False)
    caplog.set_level(logging.INFO, logger=ollama_api.__name__)
    greedy = {"temperature": 0, "num_predict": 8, "repeat_penalty": 1.1}
    plain = await client.chat(model=model_id, messages=QUESTION, options=greedy)
    for _ in range(2):
        reply = await client.chat(model=model_id, messages=QUESTION, options={**greedy, **NOT_APPLIED})
        assert reply.message.content == plain.message.content  # none of them is applied here
        generated = await client.generate(model=model_id, prompt="hi", raw=True, options={**greedy, **NOT_APPLIED})
        assert generated.done
    said = [r for r in caplog.records if "not applied" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO], [r.getMessage() for r in said]  # once, not per request
    assert f"options={','.join(sorted(NOT_APPLIED))} " in said[0].getMessage()
    monkeypatch.setattr(ollama_api, "_told_not_applied", set(), raising=False)
    caplog.clear()
    reply = await client.chat(model=model_id, messages=QUESTION, options={**greedy, **AT_DEFAULTS})
    assert reply.message.content == plain.message.content
    assert not [r for r in caplog.records if "not applied" in r.getMessage()]  # nothing to say


async def test_repeat_last_n_is_said_only_while_a_penalty_is_on(client, model_id, caplog, monkeypatch):
    """The penalties' window changes nothing with the penalties off, as the docs say; it was said
    as taken, not applied all the same."""
    monkeypatch.setattr(ollama_api, "_told_not_applied", set(), raising=False)
    caplog.set_level(logging.INFO, logger=ollama_api.__name__)
    greedy = {"temperature": 0, "num_predict": 8}
    plain = await client.chat(model=model_id, messages=QUESTION, options=greedy)
    for off in ({}, {"repeat_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0.0}):
        reply = await client.chat(model=model_id, messages=QUESTION, options={**greedy, **off, "repeat_last_n": 128})
        assert reply.message.content == plain.message.content
    assert not [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    await client.chat(model=model_id, messages=QUESTION, options={**greedy, "presence_penalty": 0.5, "repeat_last_n": 128})
    said = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(said) == 1 and "options=repeat_last_n " in said[0], said


async def test_an_unknown_model_is_ollamas_404_in_its_words(client, node):
    """Apps match Ollama's `model "x" not found, try pulling it first` (and offer a pull, or say to run
    `ollama pull x`); it was /v1's `The model `x` does not exist on this node`."""
    said = 'model "nosuch" not found, try pulling it first ('
    for call in (client.chat(model="nosuch", messages=QUESTION), client.chat(model="nosuch", messages=[]),
                 client.generate(model="nosuch", prompt="hi"), client.show("nosuch"), client.embed("nosuch", "hi")):
        error = await _refused(call)
        assert error.status_code == 404 and error.error.startswith(said), error.error
        assert "swarmllm download" in error.error  # what to do instead of pulling (/api/pull is a 400)
    status, reply = await _post(node, "/v1/chat/completions", {"model": "nosuch", "messages": QUESTION})
    assert status == 404 and reply["error"]["message"] == "The model `nosuch` does not exist on this node"  # /v1's own


async def test_a_tag_other_than_latest_is_another_model_on_both_dialects(client, node, model_id):
    """`:latest` is the model (how /api/tags lists it); `llama3:8b-q4` is another model on Ollama, and
    was this node's file on the Ollama routes (any tag was cut off) while /v1 answered 404."""
    other = f"{model_id}:8b-q4"
    for call in (client.chat(model=other, messages=QUESTION, options={"num_predict": 2}),
                 client.chat(model=other, messages=[]),
                 client.generate(model=other, prompt="hi", options={"num_predict": 2}),
                 client.show(other), client.embed(other, "hi")):
        error = await _refused(call)
        assert error.status_code == 404 and error.error.startswith(f'model "{other}" not found'), error.error
    status, reply = await _post(node, "/v1/chat/completions", {"model": other, "messages": QUESTION, "max_tokens": 2})
    assert status == 404 and f"`{other}`" in reply["error"]["message"]
    latest = f"{model_id}:latest"
    reply = await client.chat(model=latest, messages=QUESTION, options={"num_predict": 2})
    assert reply.done and reply.model == latest
    assert (await client.generate(model=latest, prompt="hi", options={"num_predict": 2})).done
    assert (await client.show(latest)).details.family == "llama"
    assert len((await client.embed(latest, "hi")).embeddings) == 1
    status, reply = await _post(node, "/v1/chat/completions", {"model": latest, "messages": QUESTION, "max_tokens": 2})
    assert status == 200, reply


async def test_the_latest_tag_is_matched_in_any_case(client, node, model_id):
    """Ollama matches names and tags case-blind (routes.go getExistingName, strings.EqualFold):
    `:LATEST` and `:Latest` were 404s here. The name before the tag is matched as it is."""
    for name in (f"{model_id}:LATEST", f"{model_id}:Latest"):
        reply = await client.chat(model=name, messages=QUESTION, options={"num_predict": 2})
        assert reply.done and reply.model == name
        assert (await client.generate(model=name, prompt="hi", options={"num_predict": 2})).done
        assert (await client.show(name)).details.family == "llama"
        status, body = await _post(node, "/v1/chat/completions", {"model": name, "messages": QUESTION, "max_tokens": 2})
        assert status == 200, body
        async with httpx.AsyncClient(timeout=60) as http:
            resp = await http.get(f"http://127.0.0.1:{node.api.port}/v1/models/{name}",
                                  headers={"Authorization": f"Bearer {node.api_key}"})
        assert resp.status_code == 200 and resp.json()["id"] == model_id, resp.text
    other = f"{model_id}:LATEST-q4"  # still another tag
    error = await _refused(client.chat(model=other, messages=QUESTION, options={"num_predict": 2}))
    assert error.status_code == 404 and error.error.startswith(f'model "{other}" not found'), error.error


async def test_integer_options_sent_as_floats_are_truncated_as_ollama_does(client, model_id):
    """Ollama decodes options as float64 and truncates integer ones with int64() (api/types.go):
    `seed: 42.0`, `top_k: 40.0`, `num_predict: 4.0` (JavaScript clients send such numbers) were 400s."""
    sampled = {"temperature": 1.0, "num_predict": 8}
    for chat in (True, False):
        def ask(options: dict, chat: bool = chat):
            return (client.chat(model=model_id, messages=QUESTION, options=options) if chat
                    else client.generate(model=model_id, prompt="hi", options=options))

        def text(reply, chat: bool = chat) -> str:
            return reply.message.content if chat else reply.response

        as_int = await ask({**sampled, "seed": 42, "top_k": 40, "num_predict": 4})
        as_float = await ask({**sampled, "seed": 42.0, "top_k": 40.0, "num_predict": 4.0})
        assert text(as_float) == text(as_int) and as_float.eval_count == as_int.eval_count <= 4
        cut = await ask({**sampled, "seed": 42.9, "top_k": 40.5, "num_predict": 4.5})  # toward zero, as int64()
        assert text(cut) == text(as_int) and cut.eval_count == as_int.eval_count
        greedy = await ask({**sampled, "seed": 7, "top_k": 1})
        assert text(await ask({**sampled, "seed": 7, "top_k": 1.5})) == text(greedy)  # 1.5 is 1: greedy
