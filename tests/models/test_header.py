"""GGUF headers: extraction, the header hash, checks of fetched bytes (tampered, wrong model, size
cap), the cache, and the zero-tensor vocab file llama.cpp tokenizes from."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct

import gguf
import pytest

from node.errors import ModelLoadError
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from node.models.gguf_meta import read_header, read_header_bytes
from node.models.header import HeaderCache, HeaderRefused, check_header, extract_header, vocab_only_gguf

TINY = SynthSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=512, name="tiny")
SPECS = [TINY, dataclasses.replace(TINY, qtype="Q8_0", name="tinyq8"),
         dataclasses.replace(TINY, arch="qwen2", name="tinyqwen")]
CAP = 64 * 2**20


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("headers")
    return {spec.name: write_gguf(base / f"{spec.name}.gguf", spec) for spec in SPECS}


@pytest.mark.parametrize("name", [s.name for s in SPECS])
def test_header_is_the_bytes_before_the_tensor_data(models, name):
    path = models[name]
    data, header = extract_header(path)
    reader = gguf.GGUFReader(str(path))
    assert len(data) == header.data_offset == reader.data_offset  # gguf's own reader agrees
    assert data == path.read_bytes()[: reader.data_offset]
    assert header.data_offset % header.alignment == 0 and header.kv_end < header.data_offset
    # the header alone parses as the whole file does (tensor infos included)
    alone = read_header_bytes(data)
    full = read_header(path)
    assert (alone.n_layers, alone.architecture, alone.n_params, alone.quantization, alone.data_offset) == \
        (full.n_layers, full.architecture, full.n_params, full.quantization, full.data_offset)


def test_catalog_entry_carries_the_header_hash_once_computed(models, tmp_path):
    catalog = ModelCatalog(tmp_path)
    (entry,) = catalog.scan([(models["tiny"], "cli")])
    data, _ = extract_header(models["tiny"])
    assert entry.header_sha256 == hashlib.sha256(data).hexdigest() and entry.header_bytes == len(data)
    assert entry.id == f"tiny-{hashlib.sha256(models['tiny'].read_bytes()).hexdigest()[:8]}"
    cached = (tmp_path / "model_hashes.json").read_text()
    assert entry.header_sha256 in cached  # kept beside the file's hash: not recomputed next start
    (again,) = ModelCatalog(tmp_path).scan([(models["tiny"], "cli")])
    assert again.header_sha256 == entry.header_sha256


@pytest.mark.parametrize("name", [s.name for s in SPECS])
def test_a_truncated_file_is_skipped_saying_so_and_a_whole_one_is_not(models, name, tmp_path, caplog):
    whole = models[name]
    assert read_header(whole).data_end() == whole.stat().st_size  # the last tensor ends the file
    cut = tmp_path / whole.name
    cut.write_bytes(whole.read_bytes()[:-100])  # an interrupted copy
    catalog = ModelCatalog(tmp_path)
    with caplog.at_level("WARNING"):
        assert catalog.scan([(cut, "cli")]) == []
    assert f"{cut.name} is truncated" in caplog.text and "fetch it again" in caplog.text
    assert not (tmp_path / "model_hashes.json").exists()  # not hashed either
    assert len(catalog.scan([(whole, "cli")])) == 1


def _check(data: bytes, **over):
    args = {"header_sha256": hashlib.sha256(data).hexdigest(), "n_layers": 3, "architecture": "llama",
            "max_bytes": CAP, **over}
    return check_header(data, **args)


def test_checked_header_passes_and_tampering_is_refused(models):
    data, _ = extract_header(models["tiny"])
    assert _check(data).n_layers == 3
    tampered = bytearray(data)
    tampered[len(data) // 2] ^= 0x01
    with pytest.raises(HeaderRefused, match="hash"):
        _check(bytes(tampered), header_sha256=hashlib.sha256(data).hexdigest())
    # bytes that hash to what their sender claims but are not the advertised model
    with pytest.raises(HeaderRefused, match="layers"):
        _check(data, n_layers=6)
    with pytest.raises(HeaderRefused, match="qwen2"):
        _check(data, architecture="qwen2")
    for junk in (b"", b"GGUF", b"not a gguf at all" * 10, data[:-1], data + b"\0" * 32):
        with pytest.raises(HeaderRefused):
            _check(junk)


def test_size_cap(models):
    data, _ = extract_header(models["tiny"])
    with pytest.raises(HeaderRefused, match="cap"):
        _check(data, max_bytes=len(data) - 1)
    assert _check(data, max_bytes=len(data)).data_offset == len(data)


def test_implausible_counts_fail_fast():
    blob = b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1)
    with pytest.raises(ModelLoadError, match="implausible"):
        read_header_bytes(blob)


def test_cache_round_trip_and_a_tampered_cache_file_is_dropped(models, tmp_path):
    data, header = extract_header(models["tiny"])
    digest = hashlib.sha256(data).hexdigest()
    sha = hashlib.sha256(models["tiny"].read_bytes()).hexdigest()
    cache = HeaderCache(tmp_path / "headers")
    kw = {"header_sha256": digest, "n_layers": 3, "architecture": "llama", "max_bytes": CAP}
    assert cache.load(sha, **kw) is None
    vocab = cache.store(sha, data, header)
    assert cache.header_path(sha).read_bytes() == data and vocab == cache.vocab_path(sha)
    vocab.unlink()
    got = cache.load(sha, **kw)
    assert got is not None and got[0].exists()  # the vocab file is derived again
    raw = bytearray(data)
    raw[100] ^= 0xFF
    cache.header_path(sha).write_bytes(bytes(raw))
    assert cache.load(sha, **kw) is None
    assert not cache.header_path(sha).exists()
    with pytest.raises(ValueError):
        cache.header_path("../../etc/passwd")


def test_vocab_file_is_the_metadata_with_no_tensors(models):
    data, header = extract_header(models["tiny"])
    vocab = vocab_only_gguf(data, header)
    parsed = read_header_bytes(vocab)
    assert parsed.tensors == [] and parsed.metadata == header.metadata
    assert len(vocab) % header.alignment == 0 and len(vocab) < len(data)


@pytest.mark.llama
@pytest.mark.parametrize("name", [s.name for s in SPECS])
def test_llama_cpp_tokenizes_from_the_vocab_file_exactly_as_from_the_model(models, name, tmp_path):
    from node.inference.tokenizer import ModelTokenizer

    data, header = extract_header(models[name])
    truncated = tmp_path / "header-only.gguf"
    truncated.write_bytes(data)
    with pytest.raises(ModelLoadError):  # why the rewrite: tensors outside the file are refused
        ModelTokenizer(truncated)
    vocab = HeaderCache(tmp_path).store("0" * 64, data, header)
    messages = [{"role": "user", "content": "Hello, swarm! ünïcode and <|im_start|> text"}]
    full, alone = ModelTokenizer(models[name]), ModelTokenizer(vocab)
    try:
        assert alone.chat_tokens(messages) == full.chat_tokens(messages)
        assert alone.tokenize("plain text 123") == full.tokenize("plain text 123")
        assert (alone.n_vocab, alone.bos_id, alone.eos_id, alone.chat_template) == \
            (full.n_vocab, full.bos_id, full.eos_id, full.chat_template)
        assert [alone.piece(t) for t in range(alone.n_vocab)] == [full.piece(t) for t in range(full.n_vocab)]
    finally:
        full.close()
        alone.close()


def test_cache_prune_drops_the_unused_and_the_least_recently_used(models, tmp_path):
    data, header = extract_header(models["tiny"])
    kw = dict(header_sha256=hashlib.sha256(data).hexdigest(), n_layers=3, architecture="llama", max_bytes=CAP)
    cache = HeaderCache(tmp_path / "headers")
    shas = [f"{i:x}" * 64 for i in range(1, 6)]
    now = 1_000_000.0
    for age, sha in zip((5, 4, 3, 2, 1), shas, strict=True):  # shas[0] the oldest
        cache.store(sha, data, header)
        os.utime(cache.header_path(sha), (now - age * 100, now - age * 100))
    gone = cache.prune(max_files=3, max_age_s=450, keep=frozenset({shas[1]}), now=now)
    # shas[0] is older than max_age; of the rest the newest two fit beside the kept one
    assert sorted(gone) == sorted([shas[0], shas[2]])
    for sha in shas:
        there = sha not in gone
        assert cache.header_path(sha).exists() == there and cache.vocab_path(sha).exists() == there, sha
    assert cache.prune(max_files=3, max_age_s=450, keep=frozenset({shas[1]}), now=now) == []
    # a load is a use: it keeps the header from aging out
    before = cache.header_path(shas[3]).stat().st_mtime
    assert cache.load(shas[3], **kw) is not None
    assert cache.header_path(shas[3]).stat().st_mtime > before
    assert HeaderCache(tmp_path / "absent").prune(max_files=1, max_age_s=1) == []


def test_a_name_two_different_files_share_asks_for_an_id(tmp_path):
    """Two different files of one name (say two peers' builds of a model): asking by the name is a
    404 that says so and names the ids (it said "does not exist"); each id still resolves."""
    import pytest

    from node.errors import ModelNotFound
    from node.inference.synth import SynthSpec, write_gguf
    from node.models.catalog import ModelCatalog

    for sub, layers in (("a", 2), ("b", 3)):
        (tmp_path / sub).mkdir()
        write_gguf(tmp_path / sub / "twin.gguf",
                   SynthSpec(n_layers=layers, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128,
                             name="twin"))
    catalog = ModelCatalog(None)
    entries = catalog.scan([(tmp_path / "a" / "twin.gguf", "cli"), (tmp_path / "b" / "twin.gguf", "cli")])
    assert len(entries) == 2 and entries[0].name == entries[1].name
    with pytest.raises(ModelNotFound, match="names 2 different models here") as err:
        catalog.resolve(entries[0].name)
    assert all(e.id in err.value.message for e in entries)
    assert {catalog.resolve(e.id).sha256 for e in entries} == {e.sha256 for e in entries}


def _vocab_file(path, tokens: list[str]):
    """A GGUF with a long token list (skipped, not kept) followed by more metadata and a tensor."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(tokens)
    writer.add_string("general.name", "after the tokens")
    writer.add_tensor("t", __import__("numpy").zeros(8, dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("block", [1 << 20, 64, 9])
def test_a_long_string_array_is_skipped_across_block_boundaries_as_gguf_reads_it(tmp_path, monkeypatch, block):
    """The vocabulary's strings are skipped a block at a time (2026-12-07); strings that straddle a
    block, or are longer than one, land where gguf's own reader does; cut short, it says truncated."""
    monkeypatch.setattr("node.models.gguf_meta._SKIP_BLOCK", block)
    tokens = [f"tok{i}" * (1 + i % 7) for i in range(500)] + ["x" * 300] + [f"t{i}" for i in range(100)]
    path = _vocab_file(tmp_path / "vocab.gguf", tokens)
    header = read_header(path)
    reader = gguf.GGUFReader(str(path))
    assert header.data_offset == reader.data_offset
    assert header.array_lengths["tokenizer.ggml.tokens"] == len(tokens)
    assert header.metadata["general.name"] == "after the tokens"
    assert [(t.name, t.offset) for t in header.tensors] == [("t", 0)]
    data = path.read_bytes()[: header.data_offset]
    cut = data.index(b"x" * 300) + 100  # inside the long string
    with pytest.raises(ModelLoadError, match="truncated"):
        read_header_bytes(data[:cut])


@pytest.mark.parametrize("lie", ["string length", "array length"])
def test_a_header_with_a_huge_length_is_refused_as_a_header(tmp_path, lie):
    """Review r72: a peer's header whose skipped string or array said 2**63 bytes or more made the
    skip's seek raise OverflowError (nothing catches it), not ModelLoadError as every other lie does."""
    data = bytearray(_vocab_file(tmp_path / "vocab.gguf", [f"tok{i}" for i in range(100)]).read_bytes())
    at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 4 + 4  # value type, element type
    if lie == "string length":
        data[at + 8:at + 16] = struct.pack("<Q", 2**63 + 5)  # the first token's length
    else:
        data[at:at + 8] = struct.pack("<Q", 2**64 - 1)  # the number of tokens
    with pytest.raises(ModelLoadError, match="implausible"):
        read_header_bytes(bytes(data))
    path = tmp_path / "lie.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="implausible"):
        read_header(path)


def _nested(depth: int) -> bytes:
    """A header with one metadata key: arrays of one array, `depth` deep, around an empty u32 array."""
    def text(x: str) -> bytes:
        return struct.pack("<Q", len(x)) + x.encode()
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + text("nested") + struct.pack("<I", 9)
    return body + struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQ", 4, 0)


def test_arrays_nested_too_deep_are_refused_as_a_header_and_the_scan_goes_on(models, tmp_path):
    """Review r74: arrays nested 5000 deep (60 KB) raised RecursionError, which the catalog scan does not
    catch: one such file in models/ stopped every start, and a peer's header fetch escaped its error
    handling (fetched again at once, forever)."""
    assert read_header_bytes(_nested(2)).metadata["nested"] == [[]]  # as deep as real headers go
    with pytest.raises(ModelLoadError, match="nested more than"):
        read_header_bytes(_nested(5000))
    bad = tmp_path / "deep.gguf"
    bad.write_bytes(_nested(5000))
    catalog = ModelCatalog(tmp_path / "data")
    entries = catalog.scan([(bad, "folder"), (models["tiny"], "folder")])
    assert [e.name for e in entries] == ["tiny"] and bad in catalog.skipped, catalog.skipped
