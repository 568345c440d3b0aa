"""The line `swarmllm run` ends its start-up with names the API key's file: the README's path holds
for the default data dir only (--data-dir, SWARMLLM_NODE_DATA_DIR, XDG_DATA_HOME, macOS and Windows
move it), and "the data dir's api_key file" left a newcomer to guess where the data dir is."""

from __future__ import annotations

from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until_sync


def test_serving_line_names_the_key_file(tmp_path):
    node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"])
    try:
        line = wait_until_sync(lambda: next((x for x in node.output().splitlines() if "serving at" in x), None),
                               120, what="the serving line")
        assert str(node.data_dir / "api_key") in line, line
    finally:
        node.terminate()
