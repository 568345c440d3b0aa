"""slice_dtype and activation_bits set in config.toml or SWARMLLM_* skip the CLI's `choices`: a
wrong one ("fp16", 12) passed start-up and failed later, where a person does not look (every
--layers slice "failed to load" while the node said it was serving; every chained request refused
by its peers as "unsupported activation bits"). Refused at load, as slice_kv_dtype is."""

from __future__ import annotations

import pytest

from node.config import load_config
from node.errors import InvalidRequest


def test_slice_dtype_from_the_file_is_checked(tmp_path):
    (tmp_path / "config.toml").write_text('[inference]\nslice_dtype = "fp16"\n')
    with pytest.raises(InvalidRequest, match="slice_dtype.*auto, f32, bf16, f16, int8.*'fp16'"):
        load_config({"data_dir": str(tmp_path)}, environ={})
    (tmp_path / "config.toml").write_text('[inference]\nslice_dtype = "f16"\n')
    assert load_config({"data_dir": str(tmp_path)}, environ={}).slice_dtype == "f16"


def test_activation_bits_from_the_environment_is_checked(tmp_path):
    with pytest.raises(InvalidRequest, match="activation_bits.*32, 16, 8.*12"):
        load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_ACTIVATION_BITS": "12"})
    assert load_config({"data_dir": str(tmp_path)}, environ={"SWARMLLM_ACTIVATION_BITS": "8"}).activation_bits == 8
