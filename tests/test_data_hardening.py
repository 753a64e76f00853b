"""data/ under failure, beyond tests/test_data.py: cache files deleted or left half-built by a killed
run, and how a data error reaches the user of train.py (one line, exit code 2)."""

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from data import build_dataset
from test_data import text_cfg, write_corpus


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus", files=6)
    return tmp_path / "corpus"


@pytest.mark.parametrize("lost", ["tokenizer", "train_tokens"])
def test_a_deleted_cache_file_is_rebuilt_with_a_message(corpus_dir, tmp_path, caplog, lost):
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    good = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    expected = {split: np.array(t) for split, t in good.tokens.items()}
    del good
    pattern = "tokenizers/*.json" if lost == "tokenizer" else "tokens/*.train.bin"
    (victim,) = (p for p in cache.glob(pattern) if not p.name.endswith(".meta.json"))
    victim.unlink()  # e.g. a cache cleaner, or a partial copy of .cache/
    with caplog.at_level(logging.WARNING, logger="data"):
        again = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    assert f"cache file {victim} is missing (stale or corrupted); rebuilding it" in caplog.text
    for split, tokens in expected.items():
        np.testing.assert_array_equal(again.tokens[split], tokens)


def test_leftovers_of_a_killed_build_are_not_used(corpus_dir, tmp_path, caplog):
    """A run killed while tokenising leaves temp files and token files without their .meta.json."""
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    good = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    expected = {split: np.array(t) for split, t in good.tokens.items()}
    del good
    (meta,) = cache.glob("tokens/*.meta.json")
    meta.unlink()  # killed after writing the token files, before vouching for them
    (train_bin,) = cache.glob("tokens/*.train.bin")
    train_bin.write_bytes(train_bin.read_bytes()[:100])  # ...and one of them half written
    (cache / "tokens" / (train_bin.name + ".tmp4242")).write_bytes(b"\x00" * 64)  # another killed writer's temp
    with caplog.at_level(logging.INFO, logger="data"):
        again = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    assert "tokenised" in caplog.text  # rebuilt, and said so
    for split, tokens in expected.items():
        np.testing.assert_array_equal(again.tokens[split], tokens)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data=text", "data.paths=[nowhere/*.txt]"], "config error: data=text: data.paths: no file matches ['nowhere/*.txt']"),
        (["data=synthetic", "data.num_tokens=20"], "config error: data=synthetic: corpus too small for seq_len=32: the train split has 20 tokens"),
    ],
)
def test_a_data_error_is_one_line_and_exit_code_2(tiny_cfg, monkeypatch, caplog, overrides, message):
    import train as entry  # train.py

    monkeypatch.setattr(entry.HydraConfig, "get", lambda: SimpleNamespace(mode=entry.RunMode.RUN))
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exit_:
        entry.main.__wrapped__(tiny_cfg(*overrides))
    assert exit_.value.code == 2
    assert message in caplog.text and "Traceback" not in caplog.text
