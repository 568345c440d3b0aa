"""`--layers A-B` mistakes: given without a --model it was ignored without a word (the node served
the default model whole, as if --layers had not been given); given reversed (`--layers 5-2`) it
said the range was "outside the model's layers 0-11", which 5 and 2 are not."""

from __future__ import annotations

import pytest

from node.config import load_config
from node.errors import InvalidRequest, ModelLoadError
from node.inference.pipeline.hosted import parse_layers


def test_layers_without_a_model_is_refused(tmp_path):
    with pytest.raises(InvalidRequest, match="--layers 0-3.*--model"):
        load_config({"data_dir": str(tmp_path), "layers": "0-3"}, environ={})
    cfg = load_config({"data_dir": str(tmp_path), "layers": "0-3", "models": ["m.gguf"]}, environ={})
    assert cfg.layers == "0-3"


def test_reversed_layers_say_so():
    with pytest.raises(ModelLoadError) as info:
        parse_layers("5-2", 12)
    assert "outside" not in info.value.message and "5" in info.value.message, info.value.message
    with pytest.raises(ModelLoadError, match="outside the model's layers 0-11"):
        parse_layers("0-99", 12)
    assert parse_layers("2-5", 12) == (2, 6)
