"""A typo in a config.toml key (`prot = 8801`, `n_thread = 2`) is ignored with a warning (old configs
keep working); the warning names the key it most likely meant, so the person sees why the setting
had no effect."""

from __future__ import annotations

import logging

from node.config import load_config


def test_unknown_key_suggests_the_field(tmp_path, caplog):
    (tmp_path / "config.toml").write_text("[api]\nprot = 8801\n[inference]\nn_thread = 2\nzzz = 1\n")
    with caplog.at_level(logging.WARNING, logger="node.config"):
        cfg = load_config({"data_dir": str(tmp_path)}, environ={})
    assert cfg.port == 8800
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "prot" in text and "did you mean port?" in text, text
    assert "n_thread" in text and "did you mean n_threads?" in text, text
    zzz = [r.getMessage() for r in caplog.records if "zzz" in r.getMessage()]
    assert zzz and "did you mean" not in zzz[0], zzz
