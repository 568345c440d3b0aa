"""A config.toml edited by hand: a value of the wrong type is one error naming the key, the file and
what was expected, and the file is not touched; a table-valued setting written at the top of the
file is that setting.

Found by hand on 2026-12-06: `n_threads = 2.7` ran with 2 threads, `bootstrap = [1, 2]` dialled
"1" and "2", `region = ["TH"]` advertised the region "['TH']", all without a word; `bootstrap = 5`
said "'int' object is not iterable" and `port = "abc"` "invalid literal for int() with base 10"
(Python's words); `contribute_models = { "m" = 500 }` above the first [table] was read as a table
of settings ("ignoring unknown config key m") and the node did not help serve m."""

from __future__ import annotations

import pytest

from node.config import load_config
from node.errors import InvalidRequest


@pytest.mark.parametrize(("line", "field", "expected"), [
    ('port = "abc"', "port", "expected a whole number, got 'abc'"),
    ("n_threads = 2.7", "n_threads", "expected a whole number, got 2.7"),
    ("bootstrap = 5", "bootstrap", "expected a list of strings"),
    ("bootstrap = [1, 2]", "bootstrap", "expected a list of strings"),
    ('region = ["TH"]', "region", "expected a string, got ['TH']"),
    ('slice_weight_cache_mb = "lots"', "slice_weight_cache_mb", "expected a number, got 'lots'"),
])
def test_a_value_of_the_wrong_type_names_the_key_the_file_and_what_was_expected(tmp_path, line, field, expected):
    config = tmp_path / "config.toml"
    text = f"# mine\n[network]\n{line}\n"
    config.write_text(text)
    with pytest.raises(InvalidRequest) as err:
        load_config({"data_dir": str(tmp_path)}, environ={})
    message = err.value.message
    assert message.startswith(f"config field {field}: {expected}") and str(config) in message, message
    assert "Errno" not in message and "int()" not in message and "iterable" not in message, message
    assert config.read_text() == text


def test_whole_numbers_written_as_floats_and_lists_as_a_comma_string_are_taken(tmp_path):
    (tmp_path / "config.toml").write_text('peer_port = 27000.0\nbootstrap = "10.0.0.2:8810, 10.0.0.3:8810"\n')
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert cfg.peer_port == 27000 and cfg.bootstrap == ["10.0.0.2:8810", "10.0.0.3:8810"]


def test_a_table_setting_at_the_top_of_the_file_is_that_setting(tmp_path, caplog):
    (tmp_path / "config.toml").write_text('contribute_models = { "tiny-1234abcd" = 500 }\n\n[api]\nport = 8801\n')
    cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert cfg.contribute_models == {"tiny-1234abcd": 500} and cfg.port == 8801
    assert "unknown config key" not in caplog.text


@pytest.mark.parametrize("source", ["file", "command line"])
def test_a_region_that_is_not_a_code_is_refused(tmp_path, source):
    """A region is one code on a summary line's `regions=` (one per node): `US,EU,TH outcome=ok` read
    as three regions and forged a field, and peers show none that is not a code (review r64)."""
    region = "US,EU,TH outcome=ok"
    if source == "file":
        (tmp_path / "config.toml").write_text(f'[network]\nregion = "{region}"\n')
    with pytest.raises(InvalidRequest) as err:
        load_config({"data_dir": str(tmp_path), **({"region": region} if source != "file" else {})}, environ={})
    assert err.value.message.startswith("config field region: expected a code of letters, digits, _ and -")
    (tmp_path / "config.toml").write_text('[network]\nregion = "eu-west_1"\n')
    assert load_config({"data_dir": str(tmp_path)}, environ={}).region == "eu-west_1"
