"""What real local apps send, on the default model through the official openai SDK: requests
llama-server answers must not be a 400 here either.

- Continue sends its whole stop list to any host but api.openai.com, groq, Azure and Jan
  (core/llm/llms/OpenAI.ts `_convertArgs`): autocomplete's list holds a dozen or more sequences.
"""

from __future__ import annotations

import pytest

from tests.support.nodes import default_model_node, openai_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "What does os.path.join do?"}]

node = default_model_node("app-compat")


@pytest.fixture
def client(node):
    return openai_client(node)


@pytest.fixture
def model_id(node):
    return node.models.all()[0].id


# Continue's autocomplete stops for a Python file (template stops, multiline stops, keywords)
CONTINUE_STOPS = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>", "</fim_middle>",
                  "</code>", "\n\n", "\r\n\r\n", "/src/", "#- coding: utf-8", "```", "\ndef", "\nclass", "\n\"\"\"#"]


async def test_a_continue_sized_stop_list_is_served_and_each_sequence_stops(client, model_id):
    whole = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0)
    text = whole.choices[0].message.content
    assert "pathname" in text, text  # the default model's greedy answer: "Join two or more pathname ..."
    stops = [*CONTINUE_STOPS, "pathname"]  # the one that matches comes last, past OpenAI's 4
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12, temperature=0,
                                                 stop=stops)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == text[:text.index("pathname")]
    completion = await client.completions.create(model=model_id, prompt="def join(", max_tokens=8, temperature=0,
                                                 stop=CONTINUE_STOPS)
    assert completion.choices[0].finish_reason in ("stop", "length")

