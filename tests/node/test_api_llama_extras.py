"""What apps written for llama-server, LM Studio, Open WebUI and aider send beyond OpenAI's fields,
on the default model through the official openai SDK (`extra_body` for the non-OpenAI ones).

- SillyTavern and llama.cpp front ends send llama-server's sampler set with every request, most at
  their neutral values (`typical_p: 1`, `mirostat: 0`, `grammar: ""`, `cache_prompt: true` ...):
  each one was a 400 "unrecognized request argument". Neutral values and hints are taken and
  change nothing; a sampler this node lacks set to do something is a 400 naming it.
- `n_predict` is llama-server's max_tokens, `repetition_penalty` vLLM's repeat_penalty,
  `json_schema` llama-server's response schema, `logit_bias` as [[id, bias | false]] its list form.
- LM Studio documents `max_tokens: -1` (no limit); it was a 400.
- Open WebUI, LiteLLM and aider send `reasoning_effort`, aider `prediction`, some SDK users
  `modalities: ["text"]`: each a 400 until now; they change nothing for these models.
- `seed: -1` is llama.cpp's "random seed": it must not pin one fixed seed.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "What does os.path.join do?"}]
PROMPT = "def join(a, b):"

node = default_model_node("llama-extras")

# SillyTavern's llama.cpp defaults (and what llama-server documents as its /completion defaults)
NEUTRAL = {"cache_prompt": True, "typical_p": 1, "tfs_z": 1, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1,
           "repeat_last_n": 64, "penalize_nl": False, "n_keep": 0, "n_probs": 0, "min_keep": 0, "grammar": "",
           "ignore_eos": False, "dynatemp_range": 0, "dynatemp_exponent": 1, "xtc_probability": 0,
           "xtc_threshold": 0.1, "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2,
           "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", ":"], "top_n_sigma": -1,
           "samplers": ["top_k", "typ_p", "top_p", "min_p", "temperature"], "id_slot": -1,
           "timings_per_token": False}


async def test_llama_server_extras_at_their_defaults_change_nothing(client, model_id):
    plain = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12, temperature=0)
    extra = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12, temperature=0,
                                            extra_body=NEUTRAL)
    assert extra.choices[0].text == plain.choices[0].text
    chat = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0)
    chat_extra = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0,
                                                      extra_body=NEUTRAL)
    assert chat_extra.choices[0].message.content == chat.choices[0].message.content


async def test_n_predict_and_lm_studio_unlimited_max_tokens(client, model_id):
    short = await client.completions.create(model=model_id, prompt=PROMPT, temperature=0,
                                            extra_body={"n_predict": 3})
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"
    both = await client.completions.create(model=model_id, prompt=PROMPT, temperature=0, max_tokens=5,
                                           extra_body={"n_predict": 3})
    assert both.usage.completion_tokens == 5  # max_tokens wins, as SillyTavern sends both
    unlimited = await client.chat.completions.create(model=model_id, messages=QUESTION, temperature=0, max_tokens=-1,
                                                     stop=["."])
    assert unlimited.choices[0].finish_reason in ("stop", "length")
    assert unlimited.usage.completion_tokens >= 1


async def test_repetition_penalty_is_repeat_penalty(client, model_id):
    body = dict(model=model_id, prompt="a a a a a a a a", max_tokens=12, temperature=0)
    plain = await client.completions.create(**body)
    native = await client.completions.create(**body, extra_body={"repeat_penalty": 1.5})
    alias = await client.completions.create(**body, extra_body={"repetition_penalty": 1.5})
    assert alias.choices[0].text == native.choices[0].text
    assert native.choices[0].text != plain.choices[0].text  # the penalty did something


async def test_a_repeat_penalty_of_zero_is_a_400(client, model_id):
    """0 divides by zero (-inf * 0 is NaN on a token the grammar masked): with a grammar it was a 500
    "sampled outside the grammar" (the API fuzzer's find); vLLM's repetition_penalty must be > 0 too."""
    for extra in ({"repeat_penalty": 0, "grammar": 'root ::= "yes" | "no"'}, {"repetition_penalty": 0.0},
                  {"repeat_penalty": 5e-324, "grammar": 'root ::= "yes" | "no"'}):  # 0 as a float32
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4, temperature=1,
                                                 seed=1, extra_body=extra)
        assert info.value.body["param"] == "repeat_penalty" and "greater than 0" in info.value.body["message"]
    near = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4, temperature=1, seed=1,
                                                extra_body={"repeat_penalty": 0.01, "grammar": 'root ::= "yes" | "no"'})
    assert near.choices[0].message.content in ("yes", "no")


async def test_a_json_schema_that_cannot_compile_is_a_400_naming_json_schema(client, model_id):
    """llama-server's `json_schema` became a response_format here: its compile error named that field."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4,
                                             extra_body={"json_schema": {"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False}})
    assert info.value.body["param"] == "json_schema", info.value.body
    assert info.value.body["message"].startswith("`json_schema`: the output grammar cannot be compiled")


async def test_json_schema_and_list_logit_bias(client, model_id):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"],
              "additionalProperties": False}
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0,
                                                 extra_body={"json_schema": schema})
    assert set(json.loads(reply.choices[0].message.content)) == {"name"}
    as_map = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, temperature=0,
                                             logit_bias={"0": -100, "1": 5})
    as_list = await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, temperature=0,
                                              extra_body={"logit_bias": [[0, False], [1, 5]]})
    assert as_list.choices[0].text == as_map.choices[0].text


async def test_openai_speed_and_effort_hints_are_accepted(client, model_id):
    plain = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0)
    hinted = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0,
                                                  reasoning_effort="low", modalities=["text"],
                                                  prediction={"type": "content", "content": "It joins paths."},
                                                  user="u", metadata={"app": "test"}, store=False,
                                                  service_tier="auto", parallel_tool_calls=True)
    assert hinted.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=4,
                                             modalities=["text", "audio"])
    assert info.value.body["param"] == "modalities"


@pytest.mark.parametrize("extra", [{"typical_p": 0.5}, {"mirostat": 2}, {"n_probs": 5}, {"dry_multiplier": 0.8},
                                   {"repeat_last_n": 256, "repeat_penalty": 1.1}, {"n_predict": 0}],
                         ids=lambda e: next(iter(e)))
async def test_samplers_this_node_lacks_are_a_400_naming_them(client, model_id, extra):
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert info.value.body["param"] == next(iter(extra))
