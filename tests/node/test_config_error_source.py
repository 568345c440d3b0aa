"""A value of the wrong type says where it came from: a stale `export SWARMLLM_PORT=...` in a shell
profile gave "config field port: invalid literal for int()..." and the person looked in config.toml,
which does not have it."""

from __future__ import annotations

import pytest

from node.config import load_config
from node.errors import InvalidRequest


def test_environment_value_names_its_variable(tmp_path):
    with pytest.raises(InvalidRequest, match=r"config field port: .*'abc'.*SWARMLLM_PORT"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_PORT": "abc"})
    with pytest.raises(InvalidRequest, match=r"config field mdns: .*SWARMLLM_MDNS"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_MDNS": "maybe"})


def test_file_value_names_the_file(tmp_path):
    (tmp_path / "config.toml").write_text('[api]\nport = "abc"\n')
    with pytest.raises(InvalidRequest, match=r"config field port: .*config\.toml"):
        load_config({"data_dir": str(tmp_path)}, environ={})
