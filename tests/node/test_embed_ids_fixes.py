"""Fixes from the review of the embeddings changes (2026-12-06): `truncate` keeping the specials the
vocabulary adds, check_client_ids on UGM unknown tokens, on windows cut inside a character and
bounded, and the remote asker's cap on a holder that only sends keepalives and its input indices.
Tokenizer cases load llama.cpp's vendored vocabularies where present (skipped otherwise); the
others run always."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node import const
from node.errors import InvalidRequest
from node.inference.embeddings import check_client_ids, client_ends, cut, special_ends
from node.inference.pipeline import embed_remote
from node.inference.pipeline.embed_remote import RemoteEmbedder, _Failed, _Scope
from node.inference.pipeline.embed_wire import Embed, Embedded
from node.resources import default_model_path

VOCABS = Path("/work/cache/llama_cpp_python-0.3.36/vendor/llama.cpp/models")


def vocab(name: str):
    path = VOCABS / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path.name} is not on this machine")
    pytest.importorskip("llama_cpp")
    from node.inference.tokenizer import ModelTokenizer
    return ModelTokenizer(path)


def test_cut_keeps_the_specials_at_both_ends():
    ids = [101, 1, 2, 3, 4, 5, 102]  # [CLS] ... [SEP]
    assert cut(ids, 4, "START", 1, 1) == [101, 4, 5, 102]
    assert cut(ids, 4, "END", 1, 1) == [101, 1, 2, 102]
    assert cut(ids, 4, "END", 0, 0) == [101, 1, 2, 3]
    assert cut(ids, 7, "START", 1, 1) == ids


def test_bert_truncation_keeps_cls_and_sep():
    """CLS pooling (bge, BERT) reads [CLS]: START dropped it; END dropped [SEP]."""
    tok = vocab("bert-bge")
    ids = tok.tokenize("word " * 20)
    assert special_ends(tok) == (1, 1) and client_ends(tok, ids) == (1, 1)
    assert cut(ids, 8, "START", 1, 1) == [ids[0], *ids[-7:]]
    assert cut(ids, 8, "END", 1, 1) == [*ids[:7], ids[-1]]
    llama = vocab("llama-bpe")  # BOS added, no EOS
    assert special_ends(llama) == (1, 0)


@pytest.mark.parametrize("text", ["🦜 parrot", "word 踶 word", "x踶踶y", "▅ block", "emoji 🙂 here"])
def test_ugm_unknown_characters_pass_as_the_models_own_ids(text):
    """<unk> renders as the text "<unk>", which tokenized otherwise: 1299 of 1500 characters refused."""
    for name in ("nomic-bert-moe", "bert-bge"):
        tok = vocab(name)
        check_client_ids(tok, tok.tokenize(text), "input")


def test_spm_windows_cut_inside_a_character_pass_and_bad_bytes_do_not():
    tok = vocab("llama-spm")
    ids = tok.tokenize("日本語の文章を埋め込みます。東京都は日本の首都です。" * 2, add_bos=False)
    pieces = [tok.piece(t) for t in ids]
    edges = [k for k, p in enumerate(pieces) if len(p) == 1 and 0x80 <= p[0] < 0xC0]
    assert edges, "the text has byte-fallback pieces"
    for k in edges[:6]:  # windows starting and ending on a continuation byte
        check_client_ids(tok, ids[k:k + 16], "input")
        check_client_ids(tok, ids[max(0, k - 15):k + 1], "input")
    lead = next(t for t, p in zip(ids, pieces, strict=True) if len(p) == 1 and p[0] >= 0xE0)
    with pytest.raises(InvalidRequest, match="UTF-8"):  # an incomplete character inside is still refused
        check_client_ids(tok, [*ids[:4], lead, *ids[:4]], "input")


@pytest.mark.skipif(not default_model_path().exists(), reason="the embedded default model is not in this checkout")
def test_client_ids_check_reads_a_bounded_prefix():
    pytest.importorskip("llama_cpp")
    from node.inference.tokenizer import ModelTokenizer
    tok = ModelTokenizer(default_model_path())
    seen: list[int] = []
    real = tok.tokenize

    def counting(text, **kw):
        seen.append(len(text))
        return real(text, **kw)

    ids = real("def add(a, b):\n    return a + b  # the sum of two numbers\n" * 400)
    assert len(ids) > 2 * const.EMBED_CHECK_IDS
    tok.tokenize = counting
    check_client_ids(tok, ids, "input")
    assert seen and max(seen) < len("".join(tok.piece(t).decode() for t in ids)) / 2
    shifted = [t + 1 for t in ids]  # foreign ids are still refused from their prefix
    with pytest.raises(InvalidRequest):
        check_client_ids(tok, shifted, "input")


def test_holder_errors_name_the_clients_input_index():
    scope = _Scope(offset=2048, n_client=3000, truncated=False)
    assert scope.rebase("`input[5]` is 9000 tokens") == "`input[2053]` is 9000 tokens"
    assert _Scope(0, 5, False).rebase("`input[3]` x") == "`input[3]` x"
    assert _Scope(7, 8, False).rebase("`input` is long") == "`input[7]` is long"


class _Transport:
    def __init__(self):
        self.handlers, self.sent = {}, []

    def on_local(self, frame_type, handler):
        self.handlers[frame_type] = handler

    def send(self, node_id, frame_type, header, payload=b""):
        self.sent.append(frame_type)
        return 0


class _Deadlines:
    def ack_budget(self, node_id):
        return 0.2


@pytest.mark.asyncio
async def test_a_holder_sending_only_keepalives_is_given_up(monkeypatch):
    """It held the client's request for ever; now it is failed (and the next holder asked)."""
    monkeypatch.setattr(embed_remote.const, "EMBED_REMOTE_MAX_WAIT_S", 1.0)
    holder = "b" * 64
    asker = RemoteEmbedder("a" * 64, _Transport(), None, None, _Deadlines())
    req = Embed.of("r/1", "c" * 64, [[1, 2, 3]], "a" * 64)

    async def keepalives():
        while True:
            for _h, replies in list(asker.waiting.values()):
                replies.put_nowait(Embedded("r/1", None))
            await asyncio.sleep(0.05)

    feeder = asyncio.create_task(keepalives())
    try:
        with pytest.raises(_Failed, match="sent no vectors"):
            await asyncio.wait_for(asker._ask("r/1", holder, req, set()), 10)
    finally:
        feeder.cancel()
