"""A data dir's state files unreadable, of the wrong shape, or a folder where a file belongs, met by
the real `swarmllm run` and a real node: the node says in one line what it found and what it did,
and keeps what can be kept (a swarm, an identity merely unreadable is never replaced).

Found by hand on 2026-12-07: a swarm.json this user could not read (a sync tool's lock, a copy made
with sudo) was moved to swarm.json.broken and a NEW private swarm made, cutting the node off from
its swarm (a damaged `invites` list did the same though its secret was whole); a model_hashes.json
of another shape (`[]`, a record that is not an object) ended the start in an AttributeError
traceback, and an unreadable one was overwritten by the first save, origin records and all; an
identity.key this user could not read was "cannot write identity.key", an unreadable identity.crt
(only ever made from the key) stopped the start; a folder where api_key, identity.key,
identity.crt, swarm.json, node.lock or node.log belong was a bare `[Errno 21] Is a directory`,
config.toml one was silently no settings at all, and a file named models a bare `[Errno 17]`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys

import openai
import pytest

from node.net import Swarm, write_swarm_file
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.processes import REPO, hermetic_env
from tests.support.waiting import wait_until_sync

ROOTLESS = ("setpriv", "--bounding-set", "-all", "--inh-caps", "-all")  # root without the right to read all
needs_rootless = pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or not shutil.which("setpriv"),
                                    reason="needs root and setpriv to run without the right to read every file")


def _cmd(data_dir, rootless: bool) -> list[str]:
    return [*(ROOTLESS if rootless else ()), sys.executable, "-m", "node.cli", "run", "-p", "0", "--data-dir",
            str(data_dir), "--no-mdns", "--no-default-model"]


def _run(data_dir, *, rootless: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(data_dir, rootless), cwd=REPO, env=hermetic_env(), capture_output=True, text=True,
                          timeout=120)


def _start_and_stop(data_dir, *, rootless: bool = False) -> str:
    """Start `swarmllm run`, wait until it serves, stop it (Ctrl-C); its output."""
    out = data_dir.parent / f"{data_dir.name}-out.txt"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(_cmd(data_dir, rootless), cwd=REPO, env=hermetic_env(), stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        wait_until_sync(lambda: "serving at" in out.read_text() or proc.poll() is not None, timeout_s=120,
                        what="the node to start or end")
        assert proc.poll() is None, out.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    return out.read_text()


def _one_error(out: subprocess.CompletedProcess) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if " ERROR " in line or line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


@needs_rootless
def test_a_swarm_json_this_user_cannot_read_stops_the_start_and_is_kept(tmp_path):
    swarm = Swarm.create()
    write_swarm_file(tmp_path, swarm)
    path = tmp_path / "swarm.json"
    before = path.read_bytes()
    path.chmod(0)
    try:
        line = _one_error(_run(tmp_path, rootless=True))
    finally:
        path.chmod(0o600)
    assert f"cannot read {path} (Permission denied)" in line and "--data-dir" in line, line
    assert path.read_bytes() == before  # not replaced by a new swarm of one
    assert not (tmp_path / "swarm.json.broken").exists()


async def test_a_swarm_json_with_damaged_invites_keeps_its_swarm(tmp_path, caplog):
    data = tmp_path / "data"
    swarm = Swarm.create()
    write_swarm_file(data, swarm)
    stored = json.loads((data / "swarm.json").read_text())
    (data / "swarm.json").write_text(json.dumps({**stored, "invites": 5, "removed": "none"}))
    with caplog.at_level(logging.INFO):
        async with running_node(node_config(data)):
            pass
    assert "new private swarm" not in caplog.text, caplog.text[-3000:]
    assert json.loads((data / "swarm.json").read_text())["swarm_id"] == swarm.swarm_id
    assert not (data / "swarm.json.broken").exists()


@needs_rootless
def test_an_identity_key_this_user_cannot_read_is_said_as_a_read(tmp_path):
    _start_and_stop(tmp_path)  # first start: the identity made
    key = tmp_path / "identity.key"
    before = key.read_bytes()
    key.chmod(0)
    try:
        line = _one_error(_run(tmp_path, rootless=True))
    finally:
        key.chmod(0o600)
    assert f"cannot read {key} (Permission denied)" in line and "cannot write" not in line, line
    assert key.read_bytes() == before


@needs_rootless
def test_an_identity_crt_this_user_cannot_read_is_made_again(tmp_path):
    _start_and_stop(tmp_path)  # first start: the identity and its certificate made
    crt, key = tmp_path / "identity.crt", tmp_path / "identity.key"
    pem, identity = crt.read_bytes(), key.read_bytes()
    crt.chmod(0)
    out = _start_and_stop(tmp_path, rootless=True)
    assert "Traceback" not in out
    assert crt.read_bytes() == pem and key.read_bytes() == identity  # the same identity, its certificate again


@pytest.mark.parametrize("name", ["api_key", "identity.key", "identity.crt", "swarm.json", "node.lock", "node.log",
                                  "config.toml"])
def test_a_folder_where_a_file_belongs_is_one_line_naming_it(tmp_path, name):
    (tmp_path / name).mkdir()
    (tmp_path / name / "kept").write_text("mine")
    line = _one_error(_run(tmp_path))
    assert f"{tmp_path / name} is a directory where a file belongs: move it away" in line, line
    assert (tmp_path / name / "kept").read_text() == "mine"


def test_a_file_named_models_is_one_line_naming_it(tmp_path):
    (tmp_path / "models").write_text("mine")
    line = _one_error(_run(tmp_path))
    assert f"{tmp_path / 'models'} is a file where a folder belongs: move it away" in line, line
    assert (tmp_path / "models").read_text() == "mine"


@pytest.mark.llama
@pytest.mark.parametrize("damage", ["list", "records", "cut"])
async def test_a_model_hashes_json_of_another_shape_is_said_and_the_model_served(tmp_path, caplog, damage):
    data = tmp_path / "data"
    data.mkdir()
    model = tiny_model(tmp_path)
    origin = {"size": 1, "mtime_ns": 2, "sha256": "ab" * 32, "origin": "https://example.org/other.gguf"}
    cache = data / "model_hashes.json"
    # (files on a drive not mounted now: their folder is missing, so their records are kept, not pruned)
    x, y = str(tmp_path / "unmounted" / "x.gguf"), str(tmp_path / "unmounted" / "y.gguf")
    text = {"list": "[]", "cut": '{"/x.gguf": {"size": 1, "sha',
            "records": json.dumps({str(model.resolve()): 5, x: origin,
                                   y: {**origin, "header_bytes": "many", "header_sha256": 7}})}[damage]
    cache.write_text(text)
    with caplog.at_level(logging.INFO):
        async with running_node(node_config(data, model)) as node:
            served = [m.id for m in node.models.all()]
            assert len(served) == 1 and served[0].startswith("tiny-"), caplog.text[-3000:]
            # closed here: one left to the garbage collector closed its connections later, on a closed loop,
            # and the Traceback that logged failed this test now and then
            async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                                          max_retries=0) as client:
                reply = await client.chat.completions.create(model=served[0], max_tokens=2,
                                                             messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].finish_reason in ("length", "stop")
    # the node's own lines (an openai client another test left to the garbage collector can log its
    # closing Traceback, on that test's closed loop, while this one runs)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("node")
                and (r.exc_info or "Traceback" in r.getMessage())]
    saved = json.loads(cache.read_text())
    assert str(model.resolve()) in saved
    if damage == "records":  # the records of its shape are kept, origin and all; the others dropped, said
        assert saved[x] == origin and saved[y] == origin, saved
        assert "records of another shape dropped" in caplog.text and "dropped=1" in caplog.text
    else:  # not an object, or cut short: kept aside, said, the first save does not overwrite it
        assert (data / "model_hashes.json.broken").read_text() == text
        assert caplog.text.count("model hash cache unreadable") == 1, caplog.text[-3000:]
