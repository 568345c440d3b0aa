"""NodeConfig precedence: defaults < config.toml < SWARMLLM_* env < CLI flags."""

import pytest

from node.config import NodeConfig, load_config
from node.errors import InvalidRequest


def test_defaults(tmp_path):
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert cfg.port == 8800
    assert cfg.effective_peer_port == 8810
    assert cfg.require_api_key_for_inference is True
    assert cfg.data_dir == tmp_path


def test_precedence_toml_env_cli(tmp_path):
    (tmp_path / "config.toml").write_text('[api]\nport = 9000\nhost = "127.0.0.1"\n[inference]\nn_threads = 3\ncpu_only = true\n')
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert (cfg.port, cfg.n_threads, cfg.cpu_only) == (9000, 3, True)
    cfg = load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_PORT": "9100", "SWARMLLM_CPU_ONLY": "false"})
    assert (cfg.port, cfg.n_threads, cfg.cpu_only) == (9100, 3, False)
    cfg = load_config({"data_dir": str(tmp_path), "port": 9200}, environ={"SWARMLLM_PORT": "9100"})
    assert cfg.port == 9200


def test_data_dir_from_env(tmp_path):
    cfg = load_config({}, environ={"SWARMLLM_NODE_DATA_DIR": str(tmp_path / "d")})
    assert cfg.data_dir == tmp_path / "d"
    cfg = load_config({"data_dir": str(tmp_path / "cli")}, environ={"SWARMLLM_NODE_DATA_DIR": str(tmp_path / "d")})
    assert cfg.data_dir == tmp_path / "cli"


def test_lists_from_env_and_cli(tmp_path):
    cfg = load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_BOOTSTRAP": "a:1, b:2"})
    assert cfg.bootstrap == ["a:1", "b:2"]
    cfg = load_config({"data_dir": str(tmp_path), "models": ["/x.gguf"]}, environ={})
    assert cfg.models == ["/x.gguf"]


def test_bad_values_are_clear_errors(tmp_path):
    with pytest.raises(InvalidRequest, match="port"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_PORT": "eighty"})
    (tmp_path / "config.toml").write_text("port = [")
    with pytest.raises(InvalidRequest, match="not valid TOML"):
        load_config({"data_dir": str(tmp_path)}, environ={})


def test_unknown_toml_key_is_ignored_with_warning(tmp_path, caplog):
    (tmp_path / "config.toml").write_text("no_such_setting = 1\nport = 8900\n")
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert cfg.port == 8900
    assert "unknown config key no_such_setting" in caplog.text


def test_ephemeral_port_gives_ephemeral_peer_port():
    assert NodeConfig(port=0).effective_peer_port == 0
    assert NodeConfig(port=0, peer_port=7000).effective_peer_port == 7000
