"""The embedded default model split over two nodes answers like the single-node (llama.cpp) path."""

from __future__ import annotations

import os

import numpy as np
import pytest

from node.models.gguf_meta import read_header
from node.resources import default_model_path
from tests.pipeline.swarm import chat, run, wait_for_route, wait_peers
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]

QUESTIONS = ["What does os.path.join do?", "How do I use json.dumps?", "What does time.sleep do?"]
TIE = 0.01  # llama.cpp's two best logits this close (share of the logit scale): either token is its answer


def first_split_is_a_reference_tie(model, question: str, single: str, split: str) -> bool:
    """Where the split's greedy text first leaves llama.cpp's, was llama.cpp's own choice a near tie?

    The split runs f32 activations, llama.cpp Q8_0 quantizes them to 8 bits: logits differ by ~1-2%
    of their scale at most (the model card's llama.cpp check), so a greedy text may fork at a near tie (seen:
    'What does time.sleep do?' on the 1024-token model, 144 characters in, a gap of 0.56%)."""
    from node.inference.llamacpp import load

    llm = load().Llama(model_path=str(model), n_ctx=1024, n_threads=1, logits_all=True, verbose=False)
    try:
        prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        answer = llm.tokenize(single.encode(), add_bos=False, special=False)
        if llm.detokenize(answer).decode() != single:
            return False
        llm.eval(ids + answer)
        scores = np.asarray(llm.scores[len(ids) - 1 : len(ids) + len(answer)])
        common = len(os.path.commonprefix([single, split]))
        text = ""
        for i, token in enumerate(answer):
            text += llm.detokenize([token]).decode("utf-8", errors="replace")
            if len(text) > common:  # this token is where the texts part
                top = np.sort(scores[i])[-2:]
                return bool(top[1] - top[0] <= TIE * np.abs(scores[i]).max())
        return False
    finally:
        llm.close()


@pytest.mark.skipif(not default_model_path().exists(), reason="the embedded default model is not in this checkout")
def test_two_node_split_matches_single_node(tmp_path):
    model = default_model_path()
    n_layers = read_header(model).n_layers
    half = n_layers // 2
    single = NodeProcess(tmp_path / "single", args=["--no-mdns", "--n-threads", "1", "--cpu-only"])
    common = ["--model", str(model), "--no-default-model", "--no-mdns", "--n-threads", "1", "--slice-dtype", "f32",
              "--activation-bits", "32"]
    a = NodeProcess(tmp_path / "a", args=[*common, "--layers", f"0-{half - 1}"])
    b = NodeProcess(tmp_path / "b", args=[*common, "--layers", f"{half}-{n_layers - 1}",
                                          "--bootstrap", f"127.0.0.1:{a.peer_port}"])
    procs = [single, a, b]
    try:
        async def go():
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 1)
            split_id = await wait_for_route(a, model.stem)
            single_id = await wait_for_route(single, model.stem)
            assert split_id == single_id  # the same file: the same content-hash id on every node
            texts = []
            for q in QUESTIONS:
                s_status, s_headers, s_text = await chat(single, single_id, q, max_tokens=80)
                d_status, d_headers, d_text = await chat(a, split_id, q, max_tokens=80)
                assert s_status == d_status == 200
                assert s_headers["x-swarm-route"] == "local"
                assert d_headers["x-swarm-route"] == "distributed" and d_headers["x-swarm-segments"] == "2"
                assert s_text.strip()
                texts.append((q, s_text, d_text))
            # torch only where a slice is hosted (2026-12-07: every node imported it at start)
            assert a.torch_mapped() and b.torch_mapped() and not single.torch_mapped()
            report = await a.async_get_text("/api/admin/diagnostics")
            assert "int8 kernels: " in report and "torch not loaded" not in report
            return texts
        texts = run(go())
        assert texts[0][1] == texts[0][2]  # os.path.join: a memorised answer, no near ties
        for q, s_text, d_text in texts:
            assert d_text == s_text or first_split_is_a_reference_tie(model, q, s_text, d_text), (q, s_text, d_text)
    finally:
        for p in procs:
            p.terminate()
