"""/v1/embeddings on a model served at a long context, with the official `openai` client against a
real node. A pooled embedding takes the whole input in one llama.cpp micro-batch; until 2026-12-06
the embedding context was made with a micro-batch of the whole context and no flash attention, so
llama.cpp reserved n_ctx x n_ctx x n_head floats of attention scratch (137 GB for this 32-head
model at 32768 tokens): the context could not be made and every embeddings request was a 500
`model_load_error`, while chat on the same model worked. Now the context is sized to the longest
input seen, at most const.EMBED_MAX_INPUT_TOKENS (OpenAI's limit per input), with flash attention."""

from __future__ import annotations

import openai
import pytest
import pytest_asyncio

from node.const import EMBED_MAX_INPUT_TOKENS
from node.inference.synth import SynthSpec
from tests.support.nodes import node_config, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

N_CTX = 32768
WIDE = SynthSpec(n_layers=2, hidden=256, n_heads=32, n_kv_heads=4, ffn=256, vocab=512, n_ctx=N_CTX, name="wide")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("embed-long")
    model = tiny_model(directory, WIDE, "wide.gguf")
    async with running_node(node_config(directory / "data", model, n_ctx=N_CTX)) as n:
        yield n


@pytest.fixture
def model_id(node):
    served = node.models.all()[0]
    assert served.whole and served.n_ctx == N_CTX  # chat may use all of it
    return served.id


async def test_embeddings_work_on_a_model_served_at_a_long_context(client, model_id):
    first = await client.embeddings.create(model=model_id, input="hello world")  # base64, the SDK's default
    vector = first.data[0].embedding
    assert len(vector) == WIDE.hidden and abs(sum(x * x for x in vector) - 1.0) < 1e-5
    # a longer input makes the context larger; a short one's vector does not change with it
    long = await client.embeddings.create(model=model_id, input=[[7] * 3000, "hello world"], encoding_format="float")
    assert long.usage.prompt_tokens == 3000 + first.usage.prompt_tokens
    assert long.data[1].embedding == vector
    edge = await client.embeddings.create(model=model_id, input=[[7] * EMBED_MAX_INPUT_TOKENS], encoding_format="float")
    assert edge.usage.prompt_tokens == EMBED_MAX_INPUT_TOKENS
    again = await client.embeddings.create(model=model_id, input="hello world")
    assert again.data[0].embedding == vector


async def test_an_input_over_the_embeddings_limit_is_a_400_naming_it(client, model_id):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=model_id, input=["hi", [7] * (EMBED_MAX_INPUT_TOKENS + 1)])
    err = caught.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "input"
    assert f"{EMBED_MAX_INPUT_TOKENS} tokens" in err["message"] and "input[1]" in err["message"]
