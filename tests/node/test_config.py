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


def test_serve_auto_budget_and_period_through_every_layer(tmp_path):
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert (cfg.serve, cfg.slice_budget_mb) == ("whole", 0)
    (tmp_path / "config.toml").write_text('[inference]\nserve = "auto"\nslice_budget_mb = 512\n')
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert (cfg.serve, cfg.slice_budget_mb) == ("auto", 512)
    cfg = load_config({"data_dir": str(tmp_path)},
                      environ={"SWARMLLM_SLICE_BUDGET_MB": "64", "SWARMLLM_SERVE_REEVALUATE_S": "2.5"})
    assert (cfg.slice_budget_mb, cfg.serve_reevaluate_s) == (64, 2.5)
    cfg = load_config({"data_dir": str(tmp_path), "serve": "whole", "slice_budget_mb": 32},
                      environ={"SWARMLLM_SLICE_BUDGET_MB": "64"})
    assert (cfg.serve, cfg.slice_budget_mb) == ("whole", 32)


def test_serve_auto_conflicts_and_bad_values_are_clear(tmp_path):
    with pytest.raises(InvalidRequest, match="--layers 0-3 and --serve auto conflict"):
        load_config({"data_dir": str(tmp_path), "serve": "auto", "layers": "0-3"}, environ={})
    (tmp_path / "config.toml").write_text('serve = "auto"\n')
    with pytest.raises(InvalidRequest, match="conflict"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_LAYERS": "0-1"})
    with pytest.raises(InvalidRequest, match="serve: expected one of whole, auto"):
        load_config({"data_dir": str(tmp_path), "serve": "some"}, environ={})
    with pytest.raises(InvalidRequest, match="slice_budget_mb"):
        load_config({"data_dir": str(tmp_path), "slice_budget_mb": -1}, environ={})
    with pytest.raises(InvalidRequest, match="serve_reevaluate_s"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_SERVE_REEVALUATE_S": "soon"})


def test_cli_flags_for_serve_auto(tmp_path):
    from node.cli import build_parser
    from node.commands.run import cli_overrides

    args = build_parser().parse_args(["run", "--data-dir", str(tmp_path), "--model", "/m.gguf", "--serve", "auto",
                                      "--slice-budget-mb", "12"])
    cfg = load_config(cli_overrides(args), environ={})
    assert (cfg.serve, cfg.slice_budget_mb, cfg.layers) == ("auto", 12, None)
    args = build_parser().parse_args(["run", "--data-dir", str(tmp_path), "--serve", "auto", "--layers", "0-1"])
    with pytest.raises(InvalidRequest, match="conflict"):
        load_config(cli_overrides(args), environ={})


def test_batching_settings_from_toml_and_env_and_their_limits(tmp_path):
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert (cfg.max_concurrent, cfg.kv_cache_seqs) == (4, 4)
    (tmp_path / "config.toml").write_text("[inference]\nmax_concurrent = 8\nkv_cache_seqs = 0\n")
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert (cfg.max_concurrent, cfg.kv_cache_seqs) == (8, 0)
    cfg = load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_MAX_CONCURRENT": "2"})
    assert cfg.max_concurrent == 2
    with pytest.raises(InvalidRequest, match="max_concurrent: must be 1..64, got 0"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_MAX_CONCURRENT": "0"})
    with pytest.raises(InvalidRequest, match="kv_cache_seqs: must be 0..64, got -1"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_KV_CACHE_SEQS": "-1"})


def test_the_kv_of_a_long_context_gets_fewer_sequences_not_more_memory():
    from node.inference.whole_sizing import kv_sequences

    assert kv_sequences(1024, 4, 4, 16384) == (4, 4, True)  # the default model: batching, the prefix cache
    assert kv_sequences(4096, 4, 4, 16384) == (4, 0, False)  # the cache and the spare give way first
    assert kv_sequences(2048, 4, 4, 16384) == (4, 3, True)  # the spare before the cache
    assert kv_sequences(8192, 4, 4, 16384) == (2, 0, False)
    assert kv_sequences(32768, 4, 4, 16384) == (1, 0, False)  # never less than one sequence
    assert kv_sequences(1024, 1, 4, 16384) == (1, 4, False)  # one at a time needs no spare
    for n_ctx in (256, 1024, 2048, 4096, 8192):
        concurrent, cache, spare = kv_sequences(n_ctx, 4, 4, 16384)
        assert (concurrent + cache + spare) * n_ctx <= max(16384, n_ctx)


@pytest.mark.parametrize("header", ["[desktop]", "[ desktop ]", '["desktop"]', "['desktop']", "[desktop]  # mine"])
def test_desktop_settings_replace_their_table_and_keep_every_other_line(tmp_path, header):
    import tomllib

    from node.datadir import save_desktop_settings

    path = tmp_path / "config.toml"
    path.write_text(f'# my node\nport = 8811  # keep\n\n{header}\ncontribute = true\n\n[other]\nnote = "a [x] b"\n'
                    f"tags = [\n  \"[desktop]\",\n]\n", encoding="utf-8")
    save_desktop_settings(tmp_path, {"contribute": False, "contribute_models": {"m-1\U0001f600\x7f\n": 512}})
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# my node\nport = 8811  # keep\n")
    assert '[other]\nnote = "a [x] b"\ntags = [\n  "[desktop]",\n]' in text  # the array line is not a header
    parsed = tomllib.loads(text)
    assert parsed["desktop"] == {"contribute": False, "contribute_models": {"m-1\U0001f600\x7f\n": 512}}
    assert parsed["port"] == 8811 and parsed["other"]["tags"] == ["[desktop]"]
    assert text.count("desktop]") == 2  # the new header and the array's string; the old table is gone
    save_desktop_settings(tmp_path, {"contribute": True, "contribute_models": {}})  # again: still one table
    assert tomllib.loads(path.read_text(encoding="utf-8"))["desktop"] == {"contribute": True, "contribute_models": {}}
    assert (path.stat().st_mode & 0o777) == 0o600
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert cfg.port == 8811 and cfg.contribute is True and cfg.contribute_models == {}


def test_slice_kv_dtype_from_file_and_cli_and_a_wrong_one_refused(tmp_path):
    from node.cli import build_parser
    from node.commands.run import cli_overrides

    assert load_config({"data_dir": str(tmp_path)}, environ={}).slice_kv_dtype == "auto"
    (tmp_path / "config.toml").write_text('[inference]\nslice_kv_dtype = "f32"\n')
    assert load_config({"data_dir": str(tmp_path)}, environ={}).slice_kv_dtype == "f32"
    args = build_parser().parse_args(["run", "--data-dir", str(tmp_path), "--slice-kv-dtype", "f16"])
    assert load_config(cli_overrides(args), environ={}).slice_kv_dtype == "f16"  # the flag wins over the file
    (tmp_path / "config.toml").write_text('[inference]\nslice_kv_dtype = "q8"\n')
    with pytest.raises(InvalidRequest, match="slice_kv_dtype.*auto, f16, f32.*'q8'"):
        load_config({"data_dir": str(tmp_path)}, environ={})


@pytest.mark.parametrize("field", ["n_ctx", "max_ctx"])
def test_a_negative_context_is_refused(tmp_path, field):
    with pytest.raises(InvalidRequest, match=f"config field {field}: must be 0"):
        load_config({"data_dir": str(tmp_path), field: -1}, environ={})


@pytest.mark.parametrize("argv", [["swarm", "remove", "-p", "8801", "abcd1234"], ["swarm", "remove", "abcd1234", "-p", "8801"],
                                  ["swarm", "-p", "8801", "remove", "abcd1234"]])
def test_swarm_remove_takes_the_node_id_before_or_after_the_options(argv):
    """`swarm remove -p PORT ID` was "unrecognized arguments: ID" (argparse takes a command's
    optional positionals in one run)."""
    from node.cli import parse_args

    args = parse_args(argv)
    assert (args.action, args.node_id, args.port) == ("remove", "abcd1234", 8801)


def test_an_unknown_argument_is_still_refused(capsys):
    from node.cli import parse_args

    with pytest.raises(SystemExit) as caught:
        parse_args(["models", "--bogus"])
    assert caught.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
