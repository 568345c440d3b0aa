"""Where Ollama's dialect (api/ollama.py, api/ollama_models.py) answers as Ollama itself does
(server/routes.go, api/types.go), driven by the official `ollama` client against a real node on
127.0.0.1 serving the embedded default model: an option's 400 names it as sent, options Ollama
accepts are accepted, `think` on a model that does not think, an unknown model's 404 and the `:tag`
rule shared with /v1."""

from __future__ import annotations

import ollama
import pytest

from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "hi"}]

node = default_model_node("ollama_parity")


@pytest.fixture
def model_id(node):
    return node.models.all()[0].id


@pytest.fixture
def client(node):
    return ollama.AsyncClient(host=f"http://127.0.0.1:{node.api.port}",
                              headers={"Authorization": f"Bearer {node.api_key}"})


async def _refused(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as info:
        await call
    return info.value


@pytest.mark.parametrize(("option", "value"), [("temperature", 5), ("top_p", 2), ("seed", "x"), ("stop", 5),
                                               ("top_k", 1.5)])
async def test_a_bad_option_is_named_as_sent(client, model_id, option, value):
    """An option's 400 named the /v1 field (`temperature`), which the client's request does not have."""
    for call in (client.chat(model=model_id, messages=QUESTION, options={option: value}),
                 client.generate(model=model_id, prompt="hi", options={option: value}),
                 client.generate(model=model_id, prompt="hi", raw=True, options={option: value})):
        error = await _refused(call)
        assert error.status_code == 400 and error.error.startswith(f"`options.{option}` must be"), error.error
