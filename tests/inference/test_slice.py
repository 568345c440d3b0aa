"""SliceModel behaviour that needs no reference engine: splits, KV positions, sessions, errors."""

from __future__ import annotations

import dataclasses
import logging

import gguf
import numpy as np
import pytest
import torch

from node.errors import (
    ContextLengthExceeded,
    EngineError,
    KvCacheMiss,
    KvPositionMismatch,
    ModelLoadError,
    UnsupportedArchitecture,
)
from node.inference.slice import SliceModel
from node.inference.slice.chain import SliceChain, split_ranges
from node.inference.slice.model import estimate_bytes
from node.inference.synth import SynthSpec
from node.logs import MESSAGE
from tests.inference.reference import our_logits

SPEC = SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=300, n_layers=4, n_ctx=128)
TOKENS = [1, *range(10, 50)]


@pytest.fixture(scope="module")
def model_path(synth_model):
    return synth_model(SPEC)


@pytest.mark.parametrize("dtype", ["f32", "int8"])
def test_one_two_three_slices_give_the_same_logits(model_path, dtype):
    one = our_logits(SliceChain.load(model_path, 1, dtype=dtype), TOKENS, decode_from=30)
    for n in (2, 3):
        split = our_logits(SliceChain.load(model_path, n, dtype=dtype), TOKENS, decode_from=30)
        np.testing.assert_allclose(split, one, rtol=0, atol=1e-5)


def test_prefill_decode_and_chunked_prefill_agree(model_path):
    c = SliceChain.load(model_path, 1, dtype="f32", kv_dtype="f32")  # f16 caches: see test_kv16_*
    whole = our_logits(c, TOKENS)
    stepwise = our_logits(c, TOKENS, decode_from=1)
    np.testing.assert_allclose(stepwise, whole, atol=1e-4)
    c.new_session("chunks")  # prefill in chunks: index_pos > 0 with T > 1 needs the offset mask
    parts = [c.forward("chunks", TOKENS[a:b], a) for a, b in ((0, 7), (7, 20), (20, len(TOKENS)))]
    np.testing.assert_allclose(torch.cat(parts).numpy(), whole, atol=1e-4)


def test_kv_position_mismatch_names_both_numbers(model_path):
    m = SliceModel.load(model_path, dtype="f32")
    sess = m.new_session("s")
    m.forward(sess, torch.tensor(TOKENS[:5]), 0)
    with pytest.raises(KvPositionMismatch) as err:
        m.forward(sess, torch.tensor([7]), 9)
    assert (err.value.index_pos, err.value.kv_len) == (9, 5)
    assert "index_pos=9" in err.value.message
    assert "kv_len=5" in err.value.message
    assert sess.kv_len == 5  # the refused forward left the cache alone
    m.forward(sess, torch.tensor([7]), 5)
    assert sess.kv_len == 6


def test_slice_ends_take_and_give_the_right_things(model_path):
    first = SliceModel.load(model_path, 0, 2, dtype="f32")
    last = SliceModel.load(model_path, 2, 4, dtype="f32")
    assert (first.is_first, first.is_last, last.is_first, last.is_last) == (True, False, False, True)
    assert (first.n_layers_total, first.hidden_size, first.vocab_size, first.arch) == (4, 64, 300, "llama")
    s1, s2 = first.new_session("r"), last.new_session("r")
    hidden = first.forward(s1, torch.tensor(TOKENS[:6]), 0)
    assert hidden.shape == (6, 64)
    assert hidden.dtype == torch.float32
    logits = last.forward(s2, hidden.half(), 0, last_only=True)  # f16 on the wire is accepted
    assert logits.shape == (1, 300)
    with pytest.raises(EngineError):
        last.forward(s2, torch.tensor([1, 2]), 6)  # token ids into a middle slice
    with pytest.raises(EngineError):
        first.forward(s1, torch.tensor([SPEC.vocab]), 6)  # id out of range


def test_sessions_free_ttl_and_memory_pressure(model_path, caplog):
    m = SliceModel.load(model_path, dtype="f32")
    for sid in ("a", "b", "c"):
        m.forward(m.new_session(sid), torch.tensor(TOKENS[:4]), 0)
    assert m.free_session("a") is True
    assert m.free_session("a") is False
    m.session("b").last_used -= 100  # b idle for 100 s
    with caplog.at_level(logging.INFO, logger="node.inference.slice.session"):
        assert m.sweep_sessions(ttl_s=50) == ["b"]
        assert m.sweep_sessions(max_bytes=0) == ["c"]
    evictions = [r.getMessage() for r in caplog.records if "KV-cache session evicted" in r.getMessage()]
    assert any("reason=ttl" in e and "session=b" in e for e in evictions)
    assert any("reason=memory_pressure" in e and "session=c" in e for e in evictions)
    assert len(m.sessions) == 0


def test_a_kept_session_resumes_cut_to_the_prefix_and_gives_the_same_logits(model_path):
    """Keep a finished session, resume it under a new id cut to 20 positions, feed the rest of a
    new prompt: the logits equal a fresh session's on the whole prompt."""
    m = SliceModel.load(model_path, dtype="f32")
    old = m.new_session("turn1")
    m.forward(old, torch.tensor(TOKENS[:30]), 0)
    assert m.sessions.keep("turn1", "coord") is old and m.sessions.counts() == (0, 1)
    prompt = [*TOKENS[:20], 7, 8, 9]
    resumed = m.resume_session("turn1", "turn2", 20, "coord", 0, 4)
    assert resumed is old and resumed.kv_len == 20 and resumed.kept_for is None
    assert m.session("turn1") is None and m.sessions.counts() == (1, 0)
    hit = m.forward(resumed, torch.tensor(prompt[20:]), 20, last_only=True)
    fresh = m.forward(m.new_session("fresh"), torch.tensor(prompt), 0, last_only=True)
    torch.testing.assert_close(hit, fresh, rtol=1e-5, atol=1e-5)


def test_a_kept_sessions_prefix_copied_gives_the_same_logits_and_leaves_it_whole(model_path):
    """Another conversation with the same beginning copies 20 positions of a kept session: its
    logits equal a fresh session's; the kept one still holds all 30 and resumes for its own turn."""
    m = SliceModel.load(model_path, dtype="f32")
    old = m.new_session("turn1")
    m.forward(old, torch.tensor(TOKENS[:30]), 0)
    before = old.k[:, :, :30].clone()
    m.sessions.keep("turn1", "coord")
    other = [*TOKENS[:20], 7, 8, 9]
    copied = m.resume_session("turn1", "other", 20, "coord", 0, 4, copy=True, room=3)
    assert copied is not old and copied.kv_len == 20 and copied.capacity >= 23 and copied.kept_for is None and copied.coordinator == "coord"
    assert m.sessions.counts() == (1, 1) and m.sessions.peek("turn1").kv_len == 30
    hit = m.forward(copied, torch.tensor(other[20:]), 20, last_only=True)
    fresh = m.forward(m.new_session("fresh"), torch.tensor(other), 0, last_only=True)
    torch.testing.assert_close(hit, fresh, rtol=1e-5, atol=1e-5)
    assert torch.equal(old.k[:, :, :30], before)  # the copy's writes did not reach the kept rows
    turn2 = [*TOKENS[:30], 5]
    resumed = m.resume_session("turn1", "turn2", 30, "coord", 0, 4)
    hit = m.forward(resumed, torch.tensor(turn2[30:]), 30, last_only=True)
    fresh = m.forward(m.new_session("fresh2"), torch.tensor(turn2), 0, last_only=True)
    torch.testing.assert_close(hit, fresh, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize(("setup", "resume", "reason"), [
    (None, ("gone", 4, "coord", 0, 4), "evicted"),
    ("active", ("k", 4, "coord", 0, 4), "not_kept"),
    ("kept", ("k", 4, "someone-else", 0, 4), "other_coordinator"),
    ("kept", ("k", 4, "coord", 0, 2), "layers_differ"),
    ("kept", ("k", 9, "coord", 0, 4), "shorter_than_prefix"),
])
def test_a_kept_session_resumes_only_for_its_coordinator_and_layers(model_path, setup, resume, reason, copy):
    m = SliceModel.load(model_path, dtype="f32")
    if setup is not None:
        m.forward(m.new_session("k"), torch.tensor(TOKENS[:6]), 0)
        if setup == "kept":
            m.sessions.keep("k", "coord")
    kept_id, keep, coordinator, start, end = resume
    with pytest.raises(KvCacheMiss) as err:
        m.resume_session(kept_id, "new", keep, coordinator, start, end, copy=copy)
    assert err.value.reason == reason and err.value.code == "kv_miss"
    assert m.session("new") is None
    if setup is not None:
        assert m.sessions.peek("k").kv_len == 6  # a refused resume leaves the kept session as it was


def test_memory_pressure_evicts_kept_sessions_before_ones_in_use(model_path, caplog):
    m = SliceModel.load(model_path, dtype="f32")
    for sid in ("old-active", "kept-1", "kept-2", "new-active"):
        m.forward(m.new_session(sid), torch.tensor(TOKENS[:4]), 0)
    per_session = m.session("old-active").nbytes  # (marks it used: used again below, after it)
    m.sessions.keep("kept-1", "c")
    m.sessions.keep("kept-2", "c")
    m.session("new-active")
    with caplog.at_level(logging.INFO, logger="node.inference.slice.session"):
        # room for three: the older kept one goes, though an active one was used before it
        assert m.sweep_sessions(max_bytes=3 * per_session) == ["kept-1"]
        assert m.sweep_sessions(max_bytes=per_session) == ["kept-2", "old-active"]
    assert [e for e in caplog.messages if "KV-cache session evicted" in e and "kept=True" in e]
    m.sessions.keep("new-active", "c")
    assert m.session("new-active") is None  # kept: not steppable under its own id
    m.sessions.peek("new-active").last_used -= 100
    assert m.sweep_sessions(ttl_s=1000, kept_ttl_s=50) == ["new-active"]  # kept ones have their own TTL


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: per-head Q/K norms
@pytest.mark.parametrize("split", [(0, 4), (2, 4)])
def test_a_batched_decode_step_is_bit_identical_to_each_sessions_lone_step(synth_model, split, arch, kv_dtype):
    """int8 on qgemm: four sessions' one-row steps and one session's 5-row step (a speculation's
    verify rows) in one forward give exactly (every bit) what each gives alone, logits and KV: the
    products, the norms and the rotation + attention compute each row alone (the batched chain's
    "same text alone or in a batch")."""
    from node.inference.weights import qgemm

    if not qgemm.available():
        pytest.skip("the qgemm extension is not built")
    start, end = split
    model_path = synth_model(SPEC if arch == "llama" else dataclasses.replace(SPEC, arch="qwen3"))
    m = SliceModel.load(model_path, start, end, dtype="int8", kernel="qgemm", kv_dtype=kv_dtype)
    lone = SliceModel.load(model_path, start, end, dtype="int8", kernel="qgemm", kv_dtype=kv_dtype)
    assert (m.blocks[0].q_norm is not None) == (arch == "qwen3")
    assert m.kv_dtype == (torch.float16 if kv_dtype == "f16" else torch.float32)
    gen = torch.Generator().manual_seed(3)
    steps = {3: 1, 6: 1, 9: 5, 12: 1, 20: 1}  # tokens already in the session: rows of this step
    hidden = {n: torch.randn(n + r, 64, generator=gen) for n, r in steps.items()}

    def inputs(n, step=False):
        rows = slice(n, n + steps[n]) if step else slice(0, n)
        return torch.tensor(TOKENS[rows]) if start == 0 else hidden[n][rows]

    for model in (m, lone):
        for n in steps:
            model.forward(model.new_session(f"s{n}"), inputs(n), 0)
    assert m.session("s3").k.dtype == m.kv_dtype
    batched = m.forward_many([(m.session(f"s{n}"), inputs(n, step=True), n, steps[n] == 1) for n in steps])
    for n, got in zip(steps, batched, strict=True):
        want = lone.forward(lone.session(f"s{n}"), inputs(n, step=True), n, last_only=steps[n] == 1)
        assert torch.equal(got, want), n
        a, b, e = m.session(f"s{n}"), lone.session(f"s{n}"), n + steps[n]
        assert torch.equal(a.k[:, :, :e], b.k[:, :, :e]) and torch.equal(a.v[:, :, :e], b.v[:, :, :e])


@pytest.mark.parametrize("split", [(0, 4), (0, 2), (2, 4)])
def test_a_batched_forward_gives_each_session_its_lone_forwards_output(model_path, split):
    """Three sessions at different positions, one decoding a token, one a 5-row step, one its
    first prefill, in one forward: each output (and the KV it leaves) equals what the session's
    own forward gives (f32)."""
    start, end = split
    m = SliceModel.load(model_path, start, end, dtype="f32")
    lone = SliceModel.load(model_path, start, end, dtype="f32")

    def inputs(tokens):
        if start == 0:
            return torch.tensor(tokens)
        return torch.randn(len(tokens), 64, generator=torch.Generator().manual_seed(len(tokens)))

    history = {"a": TOKENS[:12], "b": TOKENS[:7], "c": []}
    step = {"a": [TOKENS[12]], "b": TOKENS[7:12], "c": TOKENS[:9]}
    for model in (m, lone):
        for sid, done in history.items():
            s = model.new_session(sid)
            if done:
                model.forward(s, inputs(done), 0)
    steps = [(m.session(sid), inputs(step[sid]), len(history[sid]), sid != "b") for sid in ("a", "b", "c")]
    batched = m.forward_many(steps)
    for (sess, x, pos, last_only), got in zip(steps, batched, strict=True):
        want = lone.forward(lone.session(sess.session_id), x, pos, last_only=last_only)
        assert got.shape == want.shape
        # a matrix over more rows may sum in another order: last-bit differences, no more
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
        assert sess.kv_len == lone.session(sess.session_id).kv_len == pos + x.shape[0]
    with pytest.raises(KvPositionMismatch):  # checked before anything is computed
        m.forward_many([(m.session("a"), inputs([1]), 13, True), (m.session("b"), inputs([1]), 0, True)])
    assert m.session("b").kv_len == 12
    with pytest.raises(EngineError, match="distinct"):
        m.forward_many([(m.session("a"), inputs([1]), 13, True), (m.session("a"), inputs([1]), 13, True)])


def test_context_limit_and_cache_growth(model_path):
    m = SliceModel.load(model_path, dtype="f32", max_ctx=300)
    sess = m.new_session("long")
    m.forward(sess, torch.tensor([1] * 200), 0)
    m.forward(sess, torch.tensor([1] * 60), 200)  # grows past the first 256 positions
    assert sess.capacity == 300
    with pytest.raises(ContextLengthExceeded):
        m.forward(sess, torch.tensor([1] * 41), 260)


def test_forward_pass_diag_line(model_path, caplog):
    m = SliceModel.load(model_path, 1, 3, dtype="f32")
    sess = m.new_session("d")
    with caplog.at_level(MESSAGE, logger="node.inference.slice.model"):
        m.forward(sess, torch.zeros(3, 64), 0)
    line = next(r.getMessage() for r in caplog.records if "SplitModel forward pass complete" in r.getMessage())
    for field in ("forward_ms=", "seq_len=3", "num_layers=2", "is_first=False", "is_last=False", "kv_offset=0"):
        assert field in line


def test_unsupported_architecture_and_bad_ranges(tmp_path, model_path):
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitecture, match="unsupported architecture gpt2"):
        SliceModel.load(path)
    with pytest.raises(ModelLoadError):
        SliceModel.load(model_path, 3, 9)
    with pytest.raises(ModelLoadError):
        SliceModel.load(model_path, dtype="fp8")
    with pytest.raises(ModelLoadError, match="unknown KV cache dtype 'q8'"):
        SliceModel.load(model_path, kv_dtype="q8")


def test_split_ranges_and_estimates(model_path):
    assert split_ranges(16, 3) == [(0, 6), (6, 11), (11, 16)]
    assert split_ranges(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    whole = estimate_bytes(model_path, fmt="f32")
    halves = estimate_bytes(model_path, 0, 2, fmt="f32") + estimate_bytes(model_path, 2, 4, fmt="f32")
    assert whole == halves
    assert estimate_bytes(model_path, fmt="int8") * 4 == whole


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_formats_and_half_kv_cache(model_path, dtype):
    """Half weights (the CUDA formats) with a half KV cache, on the CPU (where the cache is read as
    float32: SDPA in half, the CUDA branch, runs only on a GPU), against f32 weights and caches."""
    ref = our_logits(SliceChain.load(model_path, 1, dtype="f32", kv_dtype="f32"), TOKENS, decode_from=30)
    c = SliceChain.load(model_path, 2, dtype=dtype, kv_dtype="f16")
    assert all(s.kv_dtype == torch.float16 for s in c.slices)
    out = our_logits(c, TOKENS, decode_from=30)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 0.02
    assert (out.argmax(1) == ref.argmax(1)).mean() >= 0.95


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_fused_block_decode_gives_the_unfused_steps_bits(synth_model, arch, kv_dtype, monkeypatch):
    """int8 on qgemm: a decode step through `_attend.block_decode` (the whole block in one compiled
    call) gives every bit the unfused path gives, logits and KV, step after step."""
    from node.inference.arch import block as block_mod
    from node.inference.weights import qgemm

    if not qgemm.available() or not block_mod._FUSED:
        pytest.skip("the compiled kernels are not built")
    path = synth_model(SPEC if arch == "llama" else dataclasses.replace(SPEC, arch="qwen3"))
    fused, plain = (SliceModel.load(path, dtype="int8", kernel="qgemm", kv_dtype=kv_dtype) for _ in range(2))
    sf, sp = fused.new_session("s"), plain.new_session("s")
    assert fused.kv_dtype == (torch.float16 if kv_dtype == "f16" else torch.float32)
    fused.forward(sf, torch.tensor(TOKENS[:10]), 0)
    plain.forward(sp, torch.tensor(TOKENS[:10]), 0)
    real, used = block_mod.decode_layout, []
    for i in range(10, 30):
        monkeypatch.setattr(block_mod, "decode_layout", lambda b, cfg: used.append(1) or real(b, cfg))
        got = fused.forward(sf, torch.tensor([TOKENS[i]]), i, last_only=True)
        monkeypatch.setattr(block_mod, "decode_layout", lambda b, cfg: ())
        want = plain.forward(sp, torch.tensor([TOKENS[i]]), i, last_only=True)
        assert torch.equal(got, want), i
    assert len(used) == 20 * SPEC.n_layers and all(b.layout for b in fused.blocks)
    assert torch.equal(sf.k[:, :, :30], sp.k[:, :, :30]) and torch.equal(sf.v[:, :, :30], sp.v[:, :, :30])


def test_the_block_decode_layout_follows_the_blocks_matrices(model_path):
    """The fused step's layout (raw addresses) is made again when a matrix is replaced (as
    ggml_emulation wraps them), and there is none for a matrix that is not qgemm's or for shapes
    that do not match the config (the unfused path then runs, or raises as it would)."""
    from node.inference.arch import block as block_mod
    from node.inference.weights import qgemm

    if not qgemm.available() or not block_mod._FUSED:
        pytest.skip("the compiled kernels are not built")
    m = SliceModel.load(model_path, dtype="int8", kernel="qgemm")
    b, cfg = m.blocks[0], m.config
    layout = block_mod.decode_layout(b, cfg)
    assert layout and block_mod.decode_layout(b, cfg) is layout
    qkv = b.qkv
    b.qkv = lambda x: qkv(x)
    assert block_mod.decode_layout(b, cfg) == ()
    b.qkv = qkv
    assert block_mod.decode_layout(b, cfg) == layout
    for wrong in (dataclasses.replace(cfg, head_dim=cfg.head_dim * 2), dataclasses.replace(cfg, n_kv_heads=cfg.n_heads)):
        assert block_mod._layout(b, wrong) == ()
