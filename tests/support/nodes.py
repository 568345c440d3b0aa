"""Real nodes in the test's own process, on the test's loop (subprocess nodes: tests.support.processes)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import weakref
from pathlib import Path

from node.config import NodeConfig
from node.inference.synth import SynthSpec, write_gguf
from node.node import Node
from tests.support.swarm import join_test_swarm

TINY = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256, name="tiny")


def tiny_model(directory: Path, spec: SynthSpec = TINY, name: str = "tiny.gguf") -> Path:
    """Write (once per directory) a tiny random-weight llama GGUF."""
    path = directory / name
    if not path.exists():
        write_gguf(path, spec)
    return path


def node_config(data_dir: Path, *models: Path, **overrides) -> NodeConfig:
    """A hermetic NodeConfig: own data dir, ephemeral API and peer ports on loopback, no default
    model, no mDNS, no log file, one compute thread, in the test swarm; `overrides` are NodeConfig
    fields."""
    join_test_swarm(data_dir)
    fields = dict(data_dir=data_dir, port=0, include_default_model=False, models=[str(m) for m in models],
                  log_to_file=False, n_threads=1, mdns=False, peer_host="127.0.0.1")
    return NodeConfig(**{**fields, **overrides})


@contextlib.asynccontextmanager
async def running_node(config: NodeConfig):
    """Start a Node on the running loop; always stop it."""
    node = Node(config)
    try:
        await node.start()
        yield node
    finally:
        for client in _SDK_CLIENTS.pop(node, []):
            await client.close()
        await node.stop()


# The SDK clients made for a node (openai_client, anthropic_client), closed when it stops: left to the
# collector, each one's __del__ scheduled `aclose()` on whatever loop ran then (another test's: a
# "coroutine 'AsyncClient.aclose' was never awaited" warning), and one collected deep in a recursion
# failed as an unraisable error (a CI flake, 2026-12-07)
_SDK_CLIENTS: weakref.WeakKeyDictionary[Node, list] = weakref.WeakKeyDictionary()


def _kept(node: Node, client):
    with contextlib.suppress(TypeError):  # (a stand-in that takes no weak reference: the SDK types' warm-up)
        _SDK_CLIENTS.setdefault(node, []).append(client)
    return client


def default_model_node(name: str, **overrides):
    """A module-scoped fixture: one real node serving the embedded default model for the whole test
    module (assign it to the module's `node`); `overrides`: NodeConfig fields."""
    import pytest_asyncio

    @pytest_asyncio.fixture(loop_scope="module", scope="module")
    async def node(tmp_path_factory):
        async with running_node(node_config(tmp_path_factory.mktemp(name) / "data",
                                            include_default_model=True, **overrides)) as n:
            yield n

    return node


def tiny_models_node(*specs: SynthSpec):
    """A module-scoped fixture: one real node serving a tiny random model per spec, each in
    `<spec.name>.gguf`, for the whole test module (assign it to the module's `node`)."""
    import pytest_asyncio

    @pytest_asyncio.fixture(loop_scope="module", scope="module")
    async def node(tmp_path_factory):
        base = tmp_path_factory.mktemp(specs[0].name)
        models = [tiny_model(base, spec, f"{spec.name}.gguf") for spec in specs]
        async with running_node(node_config(base / "data", *models)) as n:
            yield n

    return node


TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"


def template(name: str) -> str:
    """A chat template of tests/fixtures/templates (`name` without `.jinja`)."""
    return (TEMPLATES / f"{name}.jinja").read_text()


def token_id(node: Node, text: str) -> str:
    """The id of the one token `text` is in the node's first model (as a logit_bias key)."""
    ids = node.models.all()[0].tokenizer.tokenize(text, add_bos=False)
    assert len(ids) == 1, ids
    return str(ids[0])


@functools.cache
def _build_sdk_models(*modules: str) -> None:
    """Build the SDK's pydantic models now. They defer it to first use (`defer_build`), which then
    runs on the test's event loop, shared with the node under test: the Responses API's types took
    0.2-0.36 s of CPU there and the loop police failed the test for the client's work."""
    import pydantic

    for name in modules:
        namespace = importlib.import_module(name)
        for obj in vars(namespace).values():
            if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel):
                obj.model_rebuild()


def build_sdk_models() -> None:
    """Every SDK's models built (pytest_configure: before any test's loop runs, so no test's first
    client pays for it on the loop it shares with its nodes)."""
    import anthropic  # noqa: F401
    import openai  # noqa: F401

    _build_sdk_models("openai.types", "openai.types.chat", "openai.types.responses")
    _build_sdk_models("anthropic.types")


def openai_client(node: Node):
    """The official openai client on a node's API (no retries: a test sees the first answer)."""
    import openai

    _build_sdk_models("openai.types", "openai.types.chat", "openai.types.responses")
    return _kept(node, openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                                          max_retries=0))


def ollama_client(node: Node):
    """The official ollama client on a node's API (its Ollama dialect, /api/...), closed at the node's stop."""
    import ollama

    return _kept(node, ollama.AsyncClient(host=f"http://127.0.0.1:{node.api.port}",
                                          headers={"Authorization": f"Bearer {node.api_key}"}))


def anthropic_client(node: Node):
    """The official anthropic client on a node's API (no retries)."""
    import anthropic

    _build_sdk_models("anthropic.types")
    return _kept(node, anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{node.api.port}", api_key=node.api_key,
                                                max_retries=0))
