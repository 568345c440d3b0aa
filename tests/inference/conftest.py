"""Fixtures of the slice-engine tests: small random GGUFs, written once per test session."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from node.inference.synth import SynthSpec, write_gguf
from node.inference.tokenizer import ModelTokenizer
from node.resources import default_model_path
from tests.support.nodes import tiny_model

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python is not installed")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads, and on a busy machine every hand-off between two
    threads waits for a scheduler tick: one thread keeps the suite fast and its timing steady."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory):
    """synth_model(spec) -> path of a GGUF for `spec`, written once per session."""
    root = tmp_path_factory.mktemp("synth")
    cache: dict[SynthSpec, object] = {}

    def make(spec: SynthSpec):
        if spec not in cache:
            cache[spec] = write_gguf(root / f"m{len(cache)}.gguf", spec)
        return cache[spec]

    return make


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    """A tiny synth model's tokenizer (grammar tests: a small vocabulary, cheap to mask)."""
    t = ModelTokenizer(tiny_model(tmp_path_factory.mktemp("vocab")))
    yield t
    t.close()


@pytest.fixture(scope="module")
def tok():
    """The embedded default model's tokenizer (grammar and tool-format tests)."""
    if not default_model_path().exists():
        pytest.skip("the embedded default model is not in this checkout")
    t = ModelTokenizer(default_model_path())
    yield t
    t.close()
