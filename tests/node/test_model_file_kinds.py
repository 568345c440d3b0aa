"""Model files as users have them in the models folder (2026-12-06).

Until then only `*.gguf` (lower case) was listed, and every `.gguf` was a model: a split model from
Hugging Face (`big-00001-of-00003.gguf` …) showed as three models, parts 2 and 3 failing with "Failed
to load model from file"; a vision projector, a LoRA adapter or a vocabulary-only file next to the
models showed as models that failed the same way (or, an adapter, "loaded"); `MODEL.GGUF` was not
seen; and a file of an architecture this llama.cpp does not know failed with that same vague text,
the cause only in llama.cpp's own log, which a quiet load discards."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil

import aiohttp
import gguf
import numpy as np
import openai
import pytest
import pytest_asyncio

from node.datadir import MODELS_DIR
from node.inference.adverts import model_adverts
from tests.support.nodes import TINY, node_config, openai_client, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


def rewrite(src, dst, *, arch=None, extra=None, tensors=True, split_max_tensors=0, drop_tensor=None,
            small_first_shard=False):
    """A copy of a GGUF with another architecture, more KV keys, no tensors, or split by
    gguf-split's rules (`dst` is then the set's name: `stem-0000N-of-0000M.gguf` are written;
    `small_first_shard`: part 1 holds the metadata only, as `gguf-split --no-tensor-first-split`)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch or str(r.fields["general.architecture"].contents()),
                        split_max_tensors=split_max_tensors, small_first_shard=small_first_shard)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    for key, value in (extra or {}).items():
        w.add_key_value(key, value, gguf.GGUFValueType.STRING)
    for t in r.tensors if tensors else []:
        if t.name != drop_tensor:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The data dir, its models folder as a user has it (written off the loop)."""
    base = tmp_path_factory.mktemp("filekinds")
    src = tiny_model(base, TINY, "src.gguf")
    models = base / "data" / MODELS_DIR
    models.mkdir(parents=True)
    rewrite(src, models / "big.gguf", split_max_tensors=8)  # big-00001-of-00003.gguf …
    rewrite(src, models / "lean.gguf", split_max_tensors=8, small_first_shard=True)  # part 1: no tensors
    for stem, respell in (("loud", lambda n: n.replace(".gguf", ".GGUF")),  # llama.cpp wants its spelling
                          ("ofs", lambda n: n.replace("-of-", "-OF-")),
                          ("mixed", lambda n: n if "-00001-" in n else n.replace("-of-", "-OF-"))):
        rewrite(src, models / f"{stem}.gguf", split_max_tensors=8)
        for part in sorted(models.glob(f"{stem}-0000?-of-00003.gguf")):
            part.rename(part.with_name(respell(part.name)))
    rewrite(src, models / "mmproj-tiny-f16.gguf", arch="clip")
    rewrite(src, models / "tiny-lora.gguf", extra={"general.type": "adapter", "adapter.type": "lora"})
    rewrite(src, models / "ggml-vocab-tiny.gguf", tensors=False)
    rewrite(src, models / "notreal.gguf", arch="notreal")
    rewrite(src, models / "holey.gguf", drop_tensor="blk.1.ffn_down.weight")
    shutil.copyfile(tiny_model(base, dataclasses.replace(TINY, seed=21), "upper-src.gguf"), models / "SHOUTY.GGUF")
    (models / "linked.gguf").symlink_to(tiny_model(base, dataclasses.replace(TINY, seed=22), "linked.gguf"))
    (models / "dangling.gguf").symlink_to(base / "nowhere.gguf")
    return base / "data", src


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(folder):
    async with running_node(node_config(folder[0], models_watch_s=0.05)) as n:
        yield n


@pytest.fixture(scope="module")
def client(node):
    return openai_client(node)


def named(node, name: str) -> list[str]:
    return [e.id for e in node.catalog.entries.values() if e.name == name]


async def test_a_split_model_is_one_model_loaded_from_part_one(node, client):
    entries = [e for e in node.catalog.entries.values() if e.name.startswith("big")]
    assert [e.name for e in entries] == ["big"], [e.id for e in node.catalog.entries.values()]
    big = entries[0]
    assert big.split_count == 3 and big.path.name == "big-00001-of-00003.gguf"
    parts = sorted((node.data_dir / MODELS_DIR).glob("big-*.gguf"))
    assert big.size_bytes == sum(p.stat().st_size for p in parts)
    assert not [p for p in node.catalog.skipped if p.name.startswith("big")], node.catalog.skipped
    reply = await client.chat.completions.create(model=big.id, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert big.id in {m.id async for m in client.models.list()}
    assert node.models.registered(big.id).state == "loaded"
    # served here only: its id hashes part 1, no peer could fetch its layers (a loaded single file is offered)
    offered = {a["sha256"] for a in model_adverts(node.catalog, node.models, node.slice_host, contribute=True)}
    shouty = node.catalog.entries[named(node, "shouty")[0]]
    assert big.sha256 not in offered and (shouty.sha256 in offered) == (node.models.registered(shouty.id).state == "loaded")


async def test_a_split_model_whose_part_one_holds_no_tensors_is_a_model(node, client):
    # `gguf-split --no-tensor-first-split`: part 1 is the metadata alone; it was ignored as "a
    # vocabulary only" (llama.cpp loads the set from it)
    models = node.data_dir / MODELS_DIR
    part1 = models / "lean-00001-of-00004.gguf"
    assert part1.is_file() and not gguf.GGUFReader(str(part1)).tensors, sorted(p.name for p in models.iterdir())
    assert part1 not in node.catalog.ignored and part1 not in node.catalog.skipped, \
        (node.catalog.ignored.get(part1), node.catalog.skipped.get(part1))
    (lean_id,) = named(node, "lean")
    lean = node.catalog.entries[lean_id]
    assert lean.split_count == 4 and lean.path.name == part1.name
    reply = await client.chat.completions.create(model=lean_id, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")


async def test_a_split_model_with_a_part_missing_says_which_and_is_taken_once_complete(node, folder, tmp_path):
    await asyncio.to_thread(rewrite, folder[1], tmp_path / "late.gguf", split_max_tensors=8)
    models = node.data_dir / MODELS_DIR
    for name in ("late-00001-of-00003.gguf", "late-00003-of-00003.gguf"):
        shutil.copyfile(tmp_path / name, models / name)
    part1 = models / "late-00001-of-00003.gguf"
    await wait_until(lambda: part1 in node.catalog.skipped, 30.0, 0.05, "part 1 refused")
    assert "late: part 2 of 3 missing" in node.catalog.skipped[part1], node.catalog.skipped[part1]
    assert not named(node, "late") and not [p for p in node.catalog.skipped if p.name.startswith("late-0000")
                                              and p != part1]
    shutil.copyfile(tmp_path / "late-00002-of-00003.gguf", models / "late-00002-of-00003.gguf")
    await wait_until(lambda: named(node, "late"), 30.0, 0.05, "the completed set served")
    assert part1 not in node.catalog.skipped


async def test_a_served_split_model_whose_part_is_deleted_leaves_and_comes_back(node, folder, tmp_path, client):
    # until 2026-12-06 only part 1 was watched: deleting part 2 left the model listed until a restart,
    # and a request then failed to load it
    await asyncio.to_thread(rewrite, folder[1], tmp_path / "brittle.gguf", split_max_tensors=8)
    models = node.data_dir / MODELS_DIR
    for i in (1, 2, 3):
        name = f"brittle-0000{i}-of-00003.gguf"
        shutil.copyfile(tmp_path / name, models / name)
    await wait_until(lambda: named(node, "brittle"), 30.0, 0.05, "the set catalogued")
    (model_id,) = named(node, "brittle")

    async def listed():  # (catalogued a moment before it is registered: one CI run listed models between)
        return model_id in {m.id async for m in client.models.list()}
    await wait_until(listed, 30.0, 0.05, "the set served")
    part1, part2 = models / "brittle-00001-of-00003.gguf", models / "brittle-00002-of-00003.gguf"
    part2.unlink()
    await wait_until(lambda: not named(node, "brittle"), 30.0, 0.05, "the model gone with its part 2")
    assert model_id not in {m.id async for m in client.models.list()}
    await wait_until(lambda: part1 in node.catalog.skipped, 30.0, 0.05, "part 1 refused, saying why")
    assert "brittle: part 2 of 3 missing" in node.catalog.skipped[part1], node.catalog.skipped[part1]
    shutil.copyfile(tmp_path / part2.name, part2)
    await wait_until(lambda: named(node, "brittle"), 30.0, 0.05, "the set served again")
    assert named(node, "brittle") == [model_id] and part1 not in node.catalog.skipped


async def test_a_split_set_not_spelt_as_llama_cpp_wants_is_refused_saying_rename(node):
    # llama.cpp opens a set only as `-0000N-of-0000M.gguf`, in lower case: `.GGUF` was listed and then
    # failed to load ("invalid split file name"), `-OF-` was refused as "part 1 of 3 missing"
    models = node.data_dir / MODELS_DIR
    for stem in ("loud", "ofs", "mixed"):
        files = sorted(p for p in models.iterdir() if p.name.startswith(f"{stem}-0000"))
        assert len(files) == 3, files
        assert not named(node, stem), sorted(node.catalog.entries)
        said = node.catalog.skipped[files[0]]
        assert "rename the parts to lower-case -of-" in said and "missing" not in said, said
        others = files[1:]
        assert not [p for p in others if p in node.catalog.skipped or p in node.catalog.ignored], others
        assert not [e for e in node.catalog.entries.values() if e.path.name in {p.name for p in others}]


async def test_files_that_are_not_models_are_not_listed_and_say_what_they_are(node, client):
    listed = {m.id async for m in client.models.list()}
    admin = {e.name for e in node.catalog.entries.values()}
    for name, what in (("mmproj-tiny-f16", "vision projector"), ("tiny-lora", "LoRA adapter"),
                       ("ggml-vocab-tiny", "vocabulary only")):
        assert name not in admin and not any(i.startswith(name) for i in listed), (name, admin)
        reason = node.catalog.ignored[node.data_dir / MODELS_DIR / f"{name}.gguf"]
        assert what in reason, reason
    assert not [p for p in node.catalog.skipped if "mmproj" in p.name or "lora" in p.name or "vocab" in p.name]
    report = await node.async_report()  # what a user pastes when asking why a file is not listed
    assert "not a model: mmproj-tiny-f16.gguf" in report and "vision projector" in report, report


async def test_any_case_suffix_and_a_link_to_a_file_elsewhere_are_served(node):
    assert named(node, "shouty") and named(node, "linked"), sorted(node.catalog.entries)
    dangling = node.data_dir / MODELS_DIR / "dangling.gguf"
    said = node.catalog.skipped[dangling]
    assert "is a link to" in said and "nowhere.gguf, which is missing" in said, said
    looks = node.model_files.watcher.looks
    await wait_until(lambda: node.model_files.watcher.looks >= looks + 3, 30.0, 0.02, "3 looks at models/")
    assert dangling in node.catalog.skipped, "the watch forgot why the link is not served"


@pytest.mark.parametrize(("name", "cause"), [("notreal", "unknown model architecture: 'notreal'"),
                                           ("holey", "tensor 'blk.1.ffn_down.weight' not found")])
async def test_a_failed_load_says_what_llama_cpp_said(node, name, cause):
    model_id = named(node, name)[0]
    with pytest.raises(openai.APIStatusError) as refused:
        await openai_client(node).chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert refused.value.body["code"] == "model_load_failed", refused.value.body
    assert cause in refused.value.message, refused.value.message


async def test_models_add_of_part_one_serves_the_set_or_names_the_missing_part(node, folder, tmp_path):
    # `swarmllm models add` / the GUI's "Add model file…" of part 1 of a set kept elsewhere
    # (served from where it is since the check of split sets; covered here, no fix needed)
    await asyncio.to_thread(rewrite, folder[1], tmp_path / "away.gguf", split_max_tensors=8)
    part1, part3 = tmp_path / "away-00001-of-00003.gguf", tmp_path / "away-00003-of-00003.gguf"
    aside = tmp_path / "aside.bin"
    part3.rename(aside)
    url = f"http://127.0.0.1:{node.api.port}/api/admin/models/add"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as s:
        async with s.post(url, json={"path": str(part1)}) as r:
            body = await r.json()
        assert r.status == 400 and "away: part 3 of 3 missing (away-00003-of-00003.gguf" in body["error"]["message"], body
        aside.rename(part3)
        async with s.post(url, json={"path": str(part1)}) as r:
            body = await r.json()
        assert r.status == 201 and body["added"], body
    (model_id,) = named(node, "away")
    assert node.catalog.entries[model_id].split_count == 3
