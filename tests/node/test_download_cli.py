"""`swarmllm download` against a real node process and a local origin: a node that stops mid-download
is said as that, with what is kept and how to go on (it was "no node answering …; is `swarmllm
run` running?", though the user had just watched it download)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from tests.support.nodes import tiny_model
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until_sync


def test_a_node_stopping_mid_download_says_the_part_is_kept_and_how_to_resume(tmp_path):
    data = tiny_model(tmp_path).read_bytes()
    half = len(data) // 2
    with ThreadedOrigin(data, name="m.gguf") as origin:
        origin.stall_after = half  # the download hangs there until the node is stopped
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        try:
            node.wait_ready(path="/health")
            cli = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "download", origin.url, "-p", str(node.port),
                 "--data-dir", str(node.data_dir)],
                cwd=REPO, env=hermetic_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            part = node.data_dir / "models" / "m.gguf.part"
            wait_until_sync(lambda: origin.sent >= half, 60, what="bytes arriving")
            node.terminate()
            out, err = cli.communicate(timeout=60)
        finally:
            origin.release.set()
            node.terminate()
    assert cli.returncode == 1, (out, err)
    assert "stopped answering during the download" in err and "is kept" in err and "resume" in err, err
    assert "is `swarmllm run` running?" not in err
    assert part.stat().st_size > 0  # what the message promises
    size = part.stat().st_size  # the bytes on disk, not the last progress seen (it said "0.0 MB" of them)
    assert f"({size / 1e6:.1f} MB) is kept" in err or f"({size} bytes) is kept" in err, err


def test_the_progress_line_names_the_part_of_a_split_set_being_fetched():
    from node.commands.client import _part_of
    assert _part_of({"parts": 3, "part": 2}) == " (part 2/3)"
    assert _part_of({"parts": 1, "part": 1}) == ""  # one file: nothing to say
    assert _part_of({"parts": 3, "part": None}) == ""  # planned, no part fetched yet
    assert _part_of({}) == ""  # a node from before split downloads


def test_a_split_part_fetched_alone_says_what_is_still_missing():
    """A presigned part downloads alone (no model yet): its note is said, not "model None"."""
    from node.commands.client import _done_text
    note = "big-00002-of-00003.gguf is one part …: big-00001-of-00003.gguf still missing"
    text = _done_text({"file": "big-00002-of-00003.gguf", "done_bytes": 2e6, "parts": 1, "model_id": None,
                       "note": note})
    assert text == f"downloaded big-00002-of-00003.gguf (2.0 MB); {note}" and "None" not in text
    assert _done_text({"file": "m.gguf", "done_bytes": 1e6, "parts": 3, "model_id": "m-1"}) == \
        "downloaded m.gguf (1.0 MB, 3 parts): model m-1"


def test_a_finished_download_says_peers_see_it_once_it_is_loaded(tmp_path):
    """Peers see loaded models only: the two-laptop user who downloaded a model on one saw nothing on
    the other and was not told why (found in a first-hour walkthrough, 2026-12-06)."""
    from node.commands.client import NOT_SHARED_YET

    data = tiny_model(tmp_path).read_bytes()
    with ThreadedOrigin(data, name="m.gguf") as origin:
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        try:
            node.wait_ready(path="/health")
            done = subprocess.run(
                [sys.executable, "-m", "node.cli", "download", origin.url, "-p", str(node.port),
                 "--data-dir", str(node.data_dir)],
                cwd=REPO, env=hermetic_env(), capture_output=True, text=True, timeout=120)
        finally:
            node.terminate()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "downloaded m.gguf" in done.stdout and NOT_SHARED_YET in done.stdout, done.stdout


def test_a_split_set_is_not_promised_to_the_swarm():
    from node.commands.client import NOT_SHARED_YET, SPLIT_NOT_SHARED, sharing_text
    assert sharing_text("big-00001-of-00003.gguf") == SPLIT_NOT_SHARED
    assert sharing_text("m.gguf") == NOT_SHARED_YET


def test_a_download_a_stopped_node_left_is_listed_and_resumed_by_the_cli(tmp_path):
    """2026-12-06: after the node's restart nothing listed the kept bytes; `download --list` shows
    the download paused, `--resume ID` goes on from them (Range: nothing fetched twice). The ID is
    the one the interrupted CLI said to resume (the sidecar keeps it: the restored job had a new one)."""
    data = tiny_model(tmp_path).read_bytes()
    half = len(data) // 2

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "node.cli", "download", *args, "-p", str(node.port),
                               "--data-dir", str(node.data_dir)], cwd=REPO, env=hermetic_env(),
                              capture_output=True, text=True, timeout=120)

    with ThreadedOrigin(data, name="m.gguf") as origin:
        origin.stall_after = half
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        try:
            node.wait_ready(path="/health")
            started = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "download", origin.url, "-p", str(node.port),
                 "--data-dir", str(node.data_dir)],
                cwd=REPO, env=hermetic_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_until_sync(lambda: origin.sent >= half, 60, what="bytes arriving")
            node.terminate()
            _, said = started.communicate(timeout=60)
            kept = (tmp_path / "data" / "models" / "m.gguf.part").stat().st_size
        finally:
            origin.stall_after = None
            origin.release.set()
            node.terminate()
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])  # started again
        try:
            node.wait_ready(path="/health")
            listed = cli("--list")
            assert listed.returncode == 0, listed
            assert "paused" in listed.stdout and "m.gguf" in listed.stdout and "earlier run" in listed.stdout, listed
            job_id = listed.stdout.split()[0]
            assert f"swarmllm download --resume {job_id}`" in said, (said, listed.stdout)
            resumed = cli("--resume", job_id)
            assert resumed.returncode == 0, resumed
            assert "downloaded m.gguf" in resumed.stdout, resumed
            assert kept >= half and origin.ranges[-1] == f"bytes={kept}-"  # nothing fetched twice
        finally:
            node.terminate()
    assert (tmp_path / "data" / "models" / "m.gguf").read_bytes() == data


@pytest.mark.parametrize("how", ["--resume", "the same URL"])
def test_ctrl_c_during_a_resume_pauses_it_and_keeps_the_bytes(tmp_path, how):
    """`swarmllm download --resume ID`, or the same download again (as the messages say to), goes on
    with kept bytes: Ctrl-C there pauses it (says so, the partial file stays, --list offers it again);
    until 2026-12-06 it cancelled, deleting the file (the same-URL way found in review)."""
    data = tiny_model(tmp_path).read_bytes()
    third = len(data) // 3

    def cli(*args):
        return [sys.executable, "-m", "node.cli", "download", *args, "-p", str(node.port), "--data-dir",
                str(node.data_dir)]

    with ThreadedOrigin(data, name="m.gguf") as origin:
        origin.stall_after = third
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        try:
            node.wait_ready(path="/health")
            first = subprocess.Popen(cli(origin.url), cwd=REPO, env=hermetic_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            wait_until_sync(lambda: origin.sent >= third, 60, what="bytes arriving")
            node.terminate()  # the node stops mid-download: the job is restored paused
            first.communicate(timeout=60)
        finally:
            origin.release.set()
            node.terminate()
        origin.release = threading.Event()
        origin.stall_after = 2 * third
        part = tmp_path / "data" / "models" / "m.gguf.part"
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        try:
            node.wait_ready(path="/health")
            listed = subprocess.run(cli("--list"), cwd=REPO, env=hermetic_env(), capture_output=True, text=True,
                                    timeout=120)
            job_id = listed.stdout.split()[0]
            said = tmp_path / "resume.err"
            with open(said, "w") as err_file:
                resuming = subprocess.Popen(cli("--resume", job_id) if how == "--resume" else cli(origin.url),
                                            cwd=REPO, env=hermetic_env(),
                                            stdout=subprocess.DEVNULL, stderr=err_file, text=True)
            wait_until_sync(lambda: origin.sent >= 2 * third, 60, what="more bytes arriving")
            wait_until_sync(lambda: "downloading" in said.read_text(), 60, what="the CLI's progress")
            resuming.send_signal(signal.SIGINT)  # Ctrl-C
            resuming.wait(60)
            err = said.read_text()
            origin.release.set()
            assert "paused" in err and "cancelled" not in err, err
            again = subprocess.run(cli("--list"), cwd=REPO, env=hermetic_env(), capture_output=True, text=True,
                                   timeout=120)
            assert "paused" in again.stdout and "--resume" in again.stdout, again.stdout
            assert part.stat().st_size >= third  # the bytes are kept
        finally:
            origin.release.set()
            node.terminate()


def test_a_node_stopping_before_any_byte_came_does_not_say_bytes_are_kept(tmp_path):
    """The node stopped while the origin had not answered yet: the line said "its partial file (0.0 MB)
    is kept … --resume ID", an id no restarted node lists (nothing was written)."""
    data = tiny_model(tmp_path).read_bytes()
    with ThreadedOrigin(data, name="m.gguf") as origin:
        origin.hold_answers = True  # the request is taken and never answered until the test ends
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        try:
            node.wait_ready(path="/health")
            cli = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "download", origin.url, "-p", str(node.port),
                 "--data-dir", str(node.data_dir)],
                cwd=REPO, env=hermetic_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_until_sync(lambda: origin.requests >= 1, 60, what="the download's request at the origin")
            node.terminate()
            out, err = cli.communicate(timeout=60)
        finally:
            origin.release.set()
            node.terminate()
    assert cli.returncode == 1, (out, err)
    assert "stopped answering during the download" in err, err
    said = err[err.index("error:"):]  # (the progress line before it says "starting 0.0 MB", as it was)
    assert "0.0 MB" not in said and "--resume" not in said and "is kept" not in said, err
    assert "nothing of it had been downloaded yet" in said, err
    assert not (node.data_dir / "models" / "m.gguf.part").exists()  # indeed nothing is kept


def test_a_node_stopping_just_after_the_file_landed_says_it_completed(tmp_path):
    """The node landed the file (`.part` renamed into models/) and stopped before the CLI's next poll
    saw the job done: it said "nothing of it had been downloaded yet … run the same download again",
    which the node then refused, "models/m.gguf already exists". The CLI is held still (SIGSTOP) while
    the download completes and the node stops, then let go: its next poll finds no node."""
    data = tiny_model(tmp_path).read_bytes()
    half = len(data) // 2
    with ThreadedOrigin(data, name="m.gguf") as origin:
        origin.stall_after = half
        node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
        cli = None
        try:
            node.wait_ready(path="/health")
            cli = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "download", origin.url, "-p", str(node.port),
                 "--data-dir", str(node.data_dir)],
                cwd=REPO, env=hermetic_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            models = node.data_dir / "models"
            wait_until_sync(lambda: origin.sent >= half, 60, what="bytes arriving")
            cli.send_signal(signal.SIGSTOP)
            origin.release.set()
            wait_until_sync(lambda: (models / "m.gguf").is_file() and not (models / "m.gguf.part").exists(), 60,
                            what="the file landing in models/")
            node.terminate()
            cli.send_signal(signal.SIGCONT)
            out, err = cli.communicate(timeout=60)
        finally:
            origin.release.set()
            if cli is not None and cli.poll() is None:
                cli.send_signal(signal.SIGCONT)
                cli.kill()
                cli.wait()
            node.terminate()
    assert cli.returncode == 1, (out, err)
    said = err[err.index("error:"):]
    assert "stopped answering during the download" in said, err
    assert "it had completed: models/m.gguf is there" in said, err
    assert "nothing of it had been downloaded" not in said and "download again" not in said, err
    assert (models / "m.gguf").read_bytes() == data
