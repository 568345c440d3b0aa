"""The llama.cpp import policy: extra (AMX-repacked) weight buffers off on AMX builds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.inference import llamacpp


def _fake(info: bytes):
    return SimpleNamespace(llama_print_system_info=lambda: info)


AMX = b"CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 1 |"
PLAIN = b"CPU : SSE3 = 1 | AVX2 = 1 | FMA = 1 | LLAMAFILE = 1 | REPACK = 1 |"


@pytest.mark.parametrize(("info", "env", "expected"), [
    (AMX, None, False),
    (PLAIN, None, True),
    (AMX, "1", True),
    (PLAIN, "0", False),
])
def test_decision(monkeypatch, info, env, expected):
    if env is None:
        monkeypatch.delenv("SWARMLLM_LLAMA_EXTRA_BUFTS", raising=False)
    else:
        monkeypatch.setenv("SWARMLLM_LLAMA_EXTRA_BUFTS", env)
    use, reason = llamacpp._decide(_fake(info))
    assert use is expected
    assert reason


def test_loaded_module_applies_the_decision():
    pytest.importorskip("llama_cpp")
    mod = llamacpp.load()
    import llama_cpp.llama_cpp as low

    params = low.llama_model_default_params()
    assert llamacpp.decision() is not None
    assert bool(params.use_extra_bufts) is llamacpp.decision()[0]
    assert llamacpp.load() is mod  # once per process
