"""The shipped default model (resources/models/swarmllm-pydoc-q8_0.gguf): metadata, tokenizer, chat.

Fast: loads the file, never retrains. llama-cpp-python tests are marked ``llama``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import gguf
import openai
import pytest

from tests.support.nodes import node_config, running_node

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "resources" / "models"
GGUF_PATH = MODELS / "swarmllm-pydoc-q8_0.gguf"
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NON_ASCII = "naïve café — 東京 🚀"
MAX_ANSWER_TOKENS = 200
JOIN_FIRST_SENTENCE = "Join two or more pathname components, inserting '/' as needed."  # os.path.join's docstring
CONTEXT = 1024  # the trained context; a tool prompt (a function or two described, a question) is 300-700 tokens
LONG_PROMPT_TOKENS = 850  # reference text before the question in the long-prompt tests
# documented stdlib callables whose docstrings make the long prompt's reference text
REFERENCE = ("json.dumps", "json.loads", "os.path.splitext", "shutil.copyfile", "textwrap.wrap",
             "textwrap.dedent", "functools.reduce", "itertools.groupby", "re.sub", "base64.b64encode",
             "heapq.heappush", "bisect.insort_right", "fnmatch.fnmatch", "glob.glob", "shlex.split",
             "zlib.crc32", "difflib.get_close_matches", "statistics.median", "math.isclose", "operator.itemgetter")


def _training_config():
    """packaging/default_model/config.py, loaded by path (``packaging/`` is not a package)."""
    path = ROOT / "packaging" / "default_model" / "config.py"
    spec = importlib.util.spec_from_file_location("_default_model_config", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reader() -> gguf.GGUFReader:
    return gguf.GGUFReader(GGUF_PATH)


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def llm():
    pytest.importorskip("llama_cpp")
    from node.inference.llamacpp import load

    llama_cpp = load()
    model = llama_cpp.Llama(model_path=str(GGUF_PATH), n_ctx=CONTEXT, n_threads=2, seed=0, verbose=False)
    yield model
    model.close()


def reference_text(count_tokens, limit: int = LONG_PROMPT_TOKENS) -> str:
    """ "Reference:" and whole stdlib docstrings (name, blank line, docstring), up to ``limit`` tokens."""
    import importlib
    import inspect

    text = "Reference:"
    for name in REFERENCE:
        module, attr = name.rsplit(".", 1)
        doc = inspect.getdoc(getattr(importlib.import_module(module), attr))
        candidate = f"{text}\n\n{name}\n\n{doc}"
        if count_tokens(candidate) <= limit:  # the ones that fit, in order
            text = candidate
    return text


@pytest.fixture(scope="module")
def long_system(llm) -> str:
    """The long prompt's system message, its length counted with the model's own tokenizer."""
    return reference_text(lambda t: len(llm.tokenize(t.encode("utf-8"), add_bos=False, special=True)))


def assert_remembers_join(choice) -> None:
    """The answer starts with os.path.join's memorised first sentence, then fluent English. After this
    long prompt the tiny model does not always end its turn (the card: 19 of 20 after ~850 tokens, and
    os.path.join here runs on after two right sentences), so the budget may end it."""
    text = choice["message"]["content"].strip()
    assert text.startswith(JOIN_FIRST_SENTENCE), text
    assert choice["finish_reason"] in ("stop", "length")
    assert_fluent_answer(". ".join(text.split(". ")[:2]))


def assert_fluent_answer(text: str) -> None:
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 5, text
    assert sum(c.isalpha() or c.isspace() or c in ".,;:'`()-/" for c in text) / len(text) > 0.9, text
    assert max(words.count(w) for w in set(words)) <= max(4, len(words) // 4), text  # no word loop


def test_file_is_shipped_and_small():
    assert GGUF_PATH.is_file()
    assert GGUF_PATH.stat().st_size <= 20 * 1024 * 1024
    assert (MODELS / "README.md").is_file()


def test_gguf_metadata(reader):
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "general.license")
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert _field(reader, "tokenizer.chat_template") == CHATML
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == len(_field(reader, "tokenizer.ggml.scores"))
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[_field(reader, "tokenizer.ggml.bos_token_id")] == "<s>"
    for special in ("<|im_start|>", "<|im_end|>"):
        assert types[tokens.index(special)] == gguf.TokenType.CONTROL
    byte_tokens = [t for t, k in zip(tokens, types, strict=True) if k == gguf.TokenType.BYTE]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]


def test_gguf_matches_training_config(reader):
    mc = _training_config().ModelConfig()
    arch = "llama"
    assert mc.context_length == CONTEXT
    assert len(_field(reader, "tokenizer.ggml.tokens")) == mc.vocab_size
    assert _field(reader, f"{arch}.context_length") == mc.context_length
    assert _field(reader, f"{arch}.embedding_length") == mc.dim
    assert _field(reader, f"{arch}.block_count") == mc.n_layers
    assert _field(reader, f"{arch}.feed_forward_length") == mc.ffn_dim
    assert _field(reader, f"{arch}.attention.head_count") == mc.n_heads
    assert _field(reader, f"{arch}.attention.head_count_kv") == mc.n_kv_heads
    assert _field(reader, f"{arch}.rope.dimension_count") == mc.head_dim
    assert _field(reader, f"{arch}.rope.freq_base") == pytest.approx(mc.rope_theta)
    assert _field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(mc.norm_eps)
    recorded = json.loads(_field(reader, "swarmllm.train_config"))
    assert recorded["model"] == dataclasses.asdict(mc)
    names = {t.name for t in reader.tensors}
    assert ("output.weight" in names) is not mc.tie_embeddings
    assert {f"blk.{mc.n_layers - 1}.ffn_down.weight", "token_embd.weight", "output_norm.weight"} <= names


@pytest.mark.llama
def test_llama_cpp_loads_it(llm):
    assert llm.metadata["general.architecture"] == "llama"
    assert llm.n_vocab() == len(gguf.GGUFReader(GGUF_PATH).fields["tokenizer.ggml.tokens"].contents())
    eos = llm.token_eos()
    assert llm.detokenize([eos], special=True) == b"<|im_end|>"
    assert llm.tokenize(b"<|im_start|>user\n", add_bos=False, special=True)[0] == llm.tokenize(
        b"<|im_start|>", add_bos=False, special=True)[0]


@pytest.mark.llama
@pytest.mark.parametrize("text", [
    NON_ASCII,
    "Return the square root of x.",
    "def f(x):\n    return {'a': x ** 2}\t# tab\n\n",
    "  leading spaces, ×÷ and Ωmega; ünïcödé in the middle",
])
def test_tokenizer_round_trips(llm, text):
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    assert ids
    assert llm.detokenize(ids).decode("utf-8") == text


@pytest.mark.llama
def test_non_ascii_uses_byte_fallback(llm):
    ids = llm.tokenize(NON_ASCII.encode("utf-8"), add_bos=False, special=False)
    pieces = [llm._model.token_get_text(i) for i in ids]
    assert any(re.fullmatch(r"<0x[0-9A-F]{2}>", p) for p in pieces)


@pytest.mark.llama
def test_greedy_chat_answer_is_fluent_and_ends_its_turn(llm):
    res = llm.create_chat_completion(
        messages=[{"role": "user", "content": "What does os.path.join do?"}],
        temperature=0.0, max_tokens=MAX_ANSWER_TOKENS)
    choice = res["choices"][0]
    text = choice["message"]["content"].strip()
    assert choice["finish_reason"] == "stop"
    assert res["usage"]["completion_tokens"] < MAX_ANSWER_TOKENS
    assert_fluent_answer(text)


@pytest.mark.llama
def test_long_prompt_fits_and_gets_a_sensible_answer(llm, long_system):
    """~850 tokens of other docstrings before the question: the answer is still os.path.join's."""
    messages = [{"role": "system", "content": long_system}, {"role": "user", "content": "What does os.path.join do?"}]
    res = llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=CONTEXT - 900)
    assert 800 <= res["usage"]["prompt_tokens"] <= 900
    assert_remembers_join(res["choices"][0])


@pytest.mark.llama
def test_greedy_generation_emits_im_end(llm):
    prompt = "<|im_start|>user\nWhat does os.path.join do?<|im_end|>\n<|im_start|>assistant\n"
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    llm.reset()
    for n, token in enumerate(llm.generate(ids, temp=0.0, top_k=1)):
        if token == llm.token_eos():
            break
        assert n < MAX_ANSWER_TOKENS, "no <|im_end|> within the token budget"


@pytest.mark.llama
async def test_node_serves_it_with_its_whole_context(tmp_path, long_system):
    """A real node with the embedded model, the official openai client: a long prompt (more than three
    times the old 256-token context) is served, not refused as context_length_exceeded."""
    async with running_node(node_config(tmp_path / "data", include_default_model=True)) as node:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                                    max_retries=0)
        model_id = node.models.all()[0].id
        reply = await client.chat.completions.create(model=model_id, temperature=0, max_tokens=100, messages=[
            {"role": "system", "content": long_system}, {"role": "user", "content": "What does os.path.join do?"}])
        assert reply.usage.prompt_tokens > 3 * 256
        assert_remembers_join(reply.choices[0].model_dump())
        with pytest.raises(openai.BadRequestError) as caught:  # and past the context: a clear refusal
            await client.chat.completions.create(model=model_id, max_tokens=10, messages=[
                {"role": "user", "content": "word " * (CONTEXT + 100)}])
        assert caught.value.body["code"] == "context_length_exceeded" and str(CONTEXT) in caught.value.body["message"]
