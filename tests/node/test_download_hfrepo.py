"""A Hugging Face repo and quant as a download (2026-12-06): `hf://owner/repo:Q4_K_M`, `hf://owner/repo`
(Q4_K_M, else Q8_0, else the first GGUF, as llama.cpp's -hf), `hf.co/owner/repo:QUANT` (Ollama's) and a
repo's page pasted from a browser. Until then only a file's URL was taken (`hf://… needs
hf://owner/repo/path/to/file.gguf`): a user who knew the repo had to find the exact file name by hand.
Against the Hub stand-in's listing (tests/support/hubserver.py: the Hub's tree endpoint, paged), through
the downloader, a real node's API and `swarmllm download` against a real node process."""

from __future__ import annotations

import asyncio
import os
import sys

import aiohttp
import pytest
import pytest_asyncio

from node import const
from node.errors import DownloadFailed, HubAccessDenied, InvalidRequest, NotFound
from node.models.download import ModelDownloader
from node.models.download.hfrepo import RepoSpec, read_spec
from tests.node.test_model_file_kinds import rewrite
from tests.support.hubserver import HubServer, use_hub
from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.processes import REPO as SOURCE_DIR
from tests.support.processes import NodeProcess, hermetic_env, hub_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

REPO = "/org/Qwen-GGUF/resolve/main/"
TOKEN = "hf_SeCrEtToKeN123"
FILES = ["Qwen-IQ4_XS.gguf", "Qwen-Q2_K.gguf", "Qwen-Q4_K_M.gguf", "Qwen-Q8_0.gguf", "mmproj-Qwen-Q4_K_M-f16.gguf",
         "README.md"]


def _bytes(name: str) -> bytes:
    return b"GGUF" + name.encode() + os.urandom(4096)


async def _hub(monkeypatch, tmp_path, files: dict[str, bytes]) -> HubServer:
    first, *rest = files
    srv = HubServer(files[first], REPO + first)
    for name in rest:
        srv.add_file(REPO + name, files[name])
    srv.tree_page_size = 2  # the listing comes in pages: every one is read
    await srv.start()
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    use_hub(monkeypatch, srv.hub, tmp_path / "hf-home")
    return srv


@pytest_asyncio.fixture
async def hub(monkeypatch, tmp_path, request):
    names = getattr(request, "param", FILES)
    srv = await _hub(monkeypatch, tmp_path, {n: _bytes(n) for n in names})
    yield srv
    await srv.stop()


async def _download(tmp_path, url):
    got = {}

    async def on_file(path, sha256, origin, _url=None):
        got.update(path=path, sha256=sha256, origin=origin)
        return "model-id"

    dl = ModelDownloader(tmp_path / "models", on_file)
    job = await dl.async_start(url)
    await wait_until(lambda: not job.active, timeout_s=30, what="the download to end")
    return job, got


async def test_the_forms_users_paste_are_read_as_a_repo_or_a_file():
    assert read_spec("hf://bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M") == \
        RepoSpec("bartowski", "Qwen2.5-7B-Instruct-GGUF", "Q4_K_M")
    assert read_spec("hf://o/r") == RepoSpec("o", "r") == read_spec("hf.co/o/r:latest")  # Ollama's default tag
    assert read_spec("hf.co/o/r:q8_0") == RepoSpec("o", "r", "q8_0") == read_spec("huggingface.co/o/r:q8_0")
    assert read_spec("hf://o/r:Q8_0@v2") == RepoSpec("o", "r", "Q8_0", "v2") == read_spec("hf://o/r@v2:Q8_0")
    assert read_spec(" https://huggingface.co/o/r ") == RepoSpec("o", "r")  # pasted from a browser
    assert read_spec("https://huggingface.co/o/r/tree/dev") == RepoSpec("o", "r", None, "dev")
    assert read_spec("https://huggingface.co/o/r/blob/main/sub/m-Q4_K_M.gguf") == "hf://o/r/sub/m-Q4_K_M.gguf@main"
    for url in ("hf://o/r/m.gguf", "https://huggingface.co/o/r/resolve/main/m.gguf",
                "https://example.com/o/r", "http://127.0.0.1:1/a.gguf"):
        assert read_spec(url) == url  # a file (or not the Hub): unchanged
    assert read_spec("hf.co/o/r:") == RepoSpec("o", "r")
    for bad in ("hf://o/r:Q4 K", "hf://-o/r", "https://hf.co/o/r:Q4%20K"):
        with pytest.raises(InvalidRequest):
            read_spec(bad)


async def test_pages_with_folders_revisions_with_slashes_and_scheme_less_file_links():
    """Found in review: a folder's page (`/tree/main/M-Q4_K_M`, where bartowski keeps split sets) was read
    as revision `main/M-Q4_K_M` (a 404); a `refs/pr/1` revision reached the file URL unencoded (the Hub
    does not resolve it so); `huggingface.co/o/r/resolve/main/x.gguf` without its scheme became
    `…/resolve/main/resolve/main/x.gguf`."""
    from node.models.download.hfrepo import pick_file
    from node.models.download.urls import resolve_url

    folder = read_spec("https://huggingface.co/o/M-GGUF/tree/main/M-Q4_K_M")
    assert folder == RepoSpec("o", "M-GGUF", None, "main", "M-Q4_K_M")
    paths = ["M-Q4_K_M/M-Q4_K_M-00001-of-00002.gguf", "M-Q4_K_M/M-Q4_K_M-00002-of-00002.gguf", "M-Q8_0.gguf"]
    assert pick_file(folder, paths) == "M-Q4_K_M/M-Q4_K_M-00001-of-00002.gguf"
    assert read_spec("https://huggingface.co/o/r/tree/refs%2Fpr%2F10") == RepoSpec("o", "r", None, "refs/pr/10")
    assert resolve_url("hf://o/r/x.gguf@refs/pr/1").endswith("/o/r/resolve/refs%2Fpr%2F1/x.gguf")
    assert read_spec("huggingface.co/o/r/resolve/main/x.gguf") == "https://huggingface.co/o/r/resolve/main/x.gguf"
    assert read_spec("hf.co/o/r/blob/main/x.gguf") == "hf://o/r/x.gguf@main"


async def test_a_lookup_ending_after_the_node_stopped_starts_nothing(tmp_path):
    """The GUI's lookup may end after the node stopped (app quit during a slow Hub): its start() made
    a download task on a closed downloader, leaked (found in review)."""
    from node.errors import ShuttingDown

    dl = ModelDownloader(tmp_path / "models", on_file=None)
    await dl.async_close()
    with pytest.raises(ShuttingDown):
        dl.start("http://127.0.0.1:9/m.gguf")
    assert dl.jobs == {}


async def test_no_quant_is_q4_k_m_as_llama_cpp_never_the_projector(tmp_path, hub):
    job, got = await _download(tmp_path, "hf://org/Qwen-GGUF")
    assert job.state == "done", job.error
    assert got["path"].name == "Qwen-Q4_K_M.gguf" and got["path"].read_bytes() == hub.files[REPO + "Qwen-Q4_K_M.gguf"]
    assert len(hub.api_requests) == len(FILES) // 2  # every page of the listing
    assert [p for p, n in hub.served.items() if n] == [REPO + "Qwen-Q4_K_M.gguf"]  # that file alone


@pytest.mark.parametrize(("hub", "picked"), [
    (["a-Q2_K.gguf", "a-Q8_0.gguf"], "a-Q8_0.gguf"),  # no Q4_K_M: Q8_0
    (["mmproj-f16.gguf", "b-Q5_K_S.gguf", "c-Q6_K.gguf"], "b-Q5_K_S.gguf"),  # neither: the first model
], indirect=["hub"])
async def test_no_quant_falls_back_as_llama_cpp(tmp_path, hub, picked):
    job, got = await _download(tmp_path, "https://huggingface.co/org/Qwen-GGUF")
    assert job.state == "done" and got["path"].name == picked, (job.error, got)


async def test_a_named_quant_matches_case_insensitively_as_a_word(tmp_path, hub):
    job, got = await _download(tmp_path, "hf.co/org/Qwen-GGUF:q8_0")
    assert job.state == "done" and got["path"].name == "Qwen-Q8_0.gguf", job.error
    job, got = await _download(tmp_path, "hf://org/Qwen-GGUF:IQ4_XS")
    assert job.state == "done" and got["path"].name == "Qwen-IQ4_XS.gguf", job.error
    with pytest.raises(InvalidRequest) as exc:  # Q4_K is a word of no file (Q4_K_M is another quant)
        await _download(tmp_path, "hf://org/Qwen-GGUF:Q4_K")
    assert "has no Q4_K file" in exc.value.message and "Qwen-Q4_K_M.gguf" in exc.value.message
    assert "mmproj" not in exc.value.message  # never offered as a model


@pytest.mark.parametrize("hub", [["x/m-Q4_K_M.gguf", "y/m-Q4_K_M.gguf", "m-Q8_0.gguf"]], indirect=True)
async def test_several_files_of_a_quant_are_a_400_naming_them(tmp_path, hub):
    for url in ("hf://org/Qwen-GGUF:Q4_K_M", "hf://org/Qwen-GGUF"):
        with pytest.raises(InvalidRequest) as exc:
            await _download(tmp_path, url)
        assert "Q4_K_M matches 2 files" in exc.value.message and "x/m-Q4_K_M.gguf, y/m-Q4_K_M.gguf" in \
            exc.value.message and "hf://org/Qwen-GGUF/x/m-Q4_K_M.gguf" in exc.value.message, exc.value.message
    assert not hub.served
    job, got = await _download(tmp_path, "hf://org/Qwen-GGUF/y/m-Q4_K_M.gguf")  # as the error says
    assert job.state == "done" and got["path"].name == "m-Q4_K_M.gguf", job.error


@pytest.mark.parametrize("hub", [["README.md", "model.safetensors"], ["mmproj-f16.gguf", "README.md"]], indirect=True)
async def test_a_repo_without_a_gguf_model_is_a_400(tmp_path, hub):
    with pytest.raises(InvalidRequest) as exc:
        await _download(tmp_path, "hf://org/Qwen-GGUF")
    assert "has no GGUF model file" in exc.value.message, exc.value.message


async def test_a_split_quant_resolves_to_its_part_1_and_the_set_is_fetched_whole(tmp_path, monkeypatch):
    src = tiny_model(tmp_path, TINY, "src.gguf")
    rewrite(src, tmp_path / "Big-Q8_0.gguf", split_max_tensors=8)
    parts = {p.name: p.read_bytes() for p in sorted(tmp_path.glob("Big-Q8_0-0000?-of-00003.gguf"))}
    hub = await _hub(monkeypatch, tmp_path, {"Big-Q4_K_M.gguf": _bytes("q4"), **parts})
    try:
        job, got = await _download(tmp_path, "hf://org/Qwen-GGUF:Q8_0")
    finally:
        await hub.stop()
    assert job.state == "done", job.error
    assert got["path"].name == "Big-Q8_0-00001-of-00003.gguf" and job.summary()["parts"] == 3
    for name, data in parts.items():
        assert (tmp_path / "models" / name).read_bytes() == data and hub.served[REPO + name] == len(data)
    assert REPO + "Big-Q4_K_M.gguf" not in hub.served


async def test_a_gated_repo_a_missing_one_and_a_missing_revision_say_so(tmp_path, hub, monkeypatch):
    hub.token = TOKEN
    with pytest.raises(HubAccessDenied) as exc:
        await _download(tmp_path, "hf://org/Qwen-GGUF:Q8_0")
    assert "401" in exc.value.message and "HF_TOKEN" in exc.value.message and exc.value.http_status == 403
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubAccessDenied) as exc:
        await _download(tmp_path, "hf://org/Qwen-GGUF:Q8_0")
    assert "403" in exc.value.message and "no access" in exc.value.message
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    job, got = await _download(tmp_path, "hf://org/Qwen-GGUF:Q8_0")
    assert job.state == "done" and got["path"].name == "Qwen-Q8_0.gguf", job.error
    assert hub.api_requests[-1]["Authorization"] == f"Bearer {TOKEN}"
    assert all("Authorization" not in h for h in hub.cdn_requests)  # the Hub only
    with pytest.raises(NotFound) as exc:
        await _download(tmp_path, "hf://org/No-Such-GGUF")
    assert "has no repo org/No-Such-GGUF" in exc.value.message
    with pytest.raises(NotFound) as exc:
        await _download(tmp_path, "hf://org/Qwen-GGUF@nope")
    assert "no revision nope" in exc.value.message
    monkeypatch.delenv("HF_TOKEN")  # a stranger asking for a missing (or private) repo gets the Hub's 401
    with pytest.raises(NotFound) as exc:
        await _download(tmp_path, "hf://org/No-Such-GGUF")
    assert "401" in exc.value.message and "HF_TOKEN" in exc.value.message


async def test_a_busy_hub_is_asked_again_after_its_retry_after(tmp_path, hub):
    hub.api_fail_with = [(429, {"Retry-After": "0"}), (503, {})]
    job, got = await _download(tmp_path, "hf://org/Qwen-GGUF")
    assert job.state == "done" and got["path"].name == "Qwen-Q4_K_M.gguf", job.error
    hub.api_fail_with = [(503, {})] * const.HF_LISTING_ATTEMPTS
    with pytest.raises(DownloadFailed) as exc:
        await _download(tmp_path / "again", "hf://org/Qwen-GGUF")
    assert "after 3 tries" in exc.value.message and "503" in exc.value.message


async def test_a_node_s_api_downloads_a_repo_s_quant_or_says_what_the_repo_has(tmp_path, monkeypatch):
    model = tiny_model(tmp_path).read_bytes()
    hub = await _hub(monkeypatch, tmp_path, {"Tiny-Q8_0.gguf": model, "Tiny-Q4_K_M.gguf": model + b"\0" * 64})
    try:
        async with running_node(node_config(tmp_path / "data")) as node, aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {node.api_key}"}) as s:
            base = f"http://127.0.0.1:{node.api.port}/api/admin"
            async with s.post(f"{base}/models/download", json={"url": "hf://org/Qwen-GGUF:Q5_K_S"}) as r:
                assert r.status == 400, await r.text()
                message = (await r.json())["error"]["message"]
            assert "has no Q5_K_S file" in message and "Tiny-Q4_K_M.gguf, Tiny-Q8_0.gguf" in message
            hub.token = TOKEN
            async with s.post(f"{base}/models/download", json={"url": "hf://org/Qwen-GGUF:Q8_0"}) as r:
                assert r.status == 403 and "HF_TOKEN" in (await r.json())["error"]["message"]
            hub.token = None
            async with s.post(f"{base}/models/download", json={"url": "hf://org/Qwen-GGUF:Q8_0"}) as r:
                assert r.status == 202, await r.text()
                job = (await r.json())["download"]
            assert job["file"] == "Tiny-Q8_0.gguf"

            async def done() -> bool:
                async with s.get(f"{base}/downloads/{job['id']}") as r:
                    job.update((await r.json())["download"])
                return job["state"] not in ("starting", "downloading", "verifying")
            await wait_until(done, timeout_s=60, what="the download to end")
            assert job["state"] == "done" and job["model_id"], job
            assert (node.data_dir / "models" / "Tiny-Q8_0.gguf").read_bytes() == model
    finally:
        await hub.stop()


async def test_swarmllm_download_takes_a_repo_and_quant(tmp_path, monkeypatch):
    """`swarmllm download hf://o/r:Q8_0` against a real node process that asks the Hub stand-in."""
    model = tiny_model(tmp_path).read_bytes()
    hub = await _hub(monkeypatch, tmp_path, {"Tiny-Q8_0.gguf": model, "Tiny-Q4_K_M.gguf": model + b"\0" * 64})
    node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"],
                       env=hub_env(hub.hub, tmp_path / "hf-home"))
    try:
        await node.async_wait_ready(path="/health")

        async def cli(url: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "node.cli", "download", url, "-p", str(node.port), "--data-dir",
                str(node.data_dir), cwd=SOURCE_DIR, env=hermetic_env(), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            return proc.returncode, out.decode(), err.decode()

        rc, out, err = await cli("hf://org/Qwen-GGUF:Q8_0")
        assert rc == 0, (out, err[-2000:], node.output()[-3000:])
        assert "downloaded Tiny-Q8_0.gguf" in out, out
        assert (node.data_dir / "models" / "Tiny-Q8_0.gguf").read_bytes() == model
        rc, out, err = await cli("hf://org/Qwen-GGUF:Q3_K_L")
        assert rc != 0 and "error: 400" in err and "has no Q3_K_L file" in err, (out, err)
    finally:
        node.terminate()
        await hub.stop()
