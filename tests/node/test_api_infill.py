"""Fill-in-the-middle through /v1/completions' `suffix` (OpenAI's field; code-completion plugins
such as Continue and Twinny send it to local servers): a model with FIM tokens gets llama-server's
/infill prompt, [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID, and the reply is the middle. A model
without them is a 400 naming `suffix`, as is `suffix` on chat. Until 2026-12-06 every `suffix` was
a 400. Real node, official openai SDK, a random-weight llama with three FIM control tokens."""

from __future__ import annotations

import dataclasses

import openai
import pytest
import pytest_asyncio

from node.inference.synth import FIM_TOKENS
from tests.support.nodes import TINY, node_config, openai_client, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n    return total\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("infill")
    fim = tiny_model(base, dataclasses.replace(TINY, fim=True, name="tiny-fim"), name="fim.gguf")
    async with running_node(node_config(base / "data", fim, tiny_model(base))) as n:
        yield n



@pytest.fixture
def client(node):  # (sync: the SDK's models are built off the loop)
    return openai_client(node)


def ids(node) -> tuple[str, str, object]:
    """(the FIM model's id, the plain model's id, the FIM model's tokenizer)"""
    fim = next(m for m in node.models.all() if m.entry.path.name == "fim.gguf")
    plain = next(m for m in node.models.all() if m.entry.path.name == "tiny.gguf")
    return fim.id, plain.id, fim.tokenizer


async def test_a_suffix_fills_in_the_middle_with_the_infill_prompt(node, client):
    fim_id, _, tok = ids(node)
    got = await client.completions.create(model=fim_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=10, temperature=0)
    # the same prompt written out: each special-token name parses to its token
    pre, suf, mid = FIM_TOKENS
    raw = await client.completions.create(model=fim_id, prompt=pre + PREFIX + suf + SUFFIX + mid,
                                          max_tokens=10, temperature=0)
    assert got.choices[0].text == raw.choices[0].text and got.usage.completion_tokens > 0
    text = len(tok.tokenize(PREFIX, add_bos=False)) + len(tok.tokenize(SUFFIX, add_bos=False))
    assert got.usage.prompt_tokens == 1 + 3 + text  # BOS, the three FIM tokens, the code
    plain = await client.completions.create(model=fim_id, prompt=PREFIX, max_tokens=10, temperature=0)
    assert plain.usage.prompt_tokens == 1 + len(tok.tokenize(PREFIX, add_bos=False))  # no suffix: as before
    empty = await client.completions.create(model=fim_id, prompt=PREFIX, suffix="", max_tokens=10, temperature=0)
    assert empty.choices[0].text == plain.choices[0].text  # "" asks for nothing, as at OpenAI
    stream = await client.completions.create(model=fim_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=10,
                                             temperature=0, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == got.choices[0].text


async def test_special_token_names_in_the_code_are_text(node, client):
    """The code is taken as text, as llama-server's /infill takes it: a file that mentions
    `<fim_middle>` does not end its prefix there."""
    fim_id, _, tok = ids(node)
    code = 'MARKER = "' + FIM_TOKENS[2] + '"\n'
    prompt = tok.infill_tokens(code, SUFFIX)
    mid = tok.tokenize(FIM_TOKENS[2], add_bos=False)
    assert len(mid) == 1 and prompt.count(mid[0]) == 1 and prompt[-1] == mid[0]
    got = await client.completions.create(model=fim_id, prompt=code, suffix=SUFFIX, max_tokens=2, temperature=0)
    assert got.usage.prompt_tokens == len(prompt)


@pytest.mark.parametrize("where", ["model_without_fim", "chat", "not_a_string"])
async def test_a_suffix_it_cannot_serve_is_a_400_naming_it(node, client, where):
    fim_id, plain_id, _ = ids(node)
    if where == "chat":
        call = client.chat.completions.create(model=fim_id, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2, extra_body={"suffix": SUFFIX})
    elif where == "model_without_fim":
        call = client.completions.create(model=plain_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=2)
    else:
        call = client.completions.create(model=fim_id, prompt=PREFIX, max_tokens=2, extra_body={"suffix": 3})
    with pytest.raises(openai.BadRequestError) as err:
        await call
    assert err.value.body["param"] == "suffix", err.value.body
    if where == "model_without_fim":
        assert "FIM" in err.value.body["message"]
