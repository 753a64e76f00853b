"""data/cache.py: entries built once, reused, and rebuilt when a file is stale, damaged, deleted or half-built."""

import logging
import threading
from pathlib import Path

import numpy as np
import pytest
from _corpus import text_cfg, write_corpus

import data.dataset
import data.tokenizer
from data import build_dataset
from data.cache import build_lock
from data.sources import load_corpus


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus"


def test_second_build_reuses_the_cache(corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    first = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(data.tokenizer, "train_bpe", no_rebuild)
    monkeypatch.setattr(data.dataset, "_write_tokens", no_rebuild)
    second = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)  # would raise if it built anything
    for split in ("train", "val"):
        np.testing.assert_array_equal(first.tokens[split], second.tokens[split])


def test_changed_settings_or_corpus_rebuild(corpus_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    build_dataset(text_cfg(corpus_dir), seq_len=16, cache_dir=cache, seed=0)
    build_dataset(text_cfg(corpus_dir, vocab_size=300), seq_len=16, cache_dir=cache, seed=0)
    assert len(list((cache / "tokenizers").glob("*.json.meta.json"))) == 2
    assert len(list((cache / "tokens").glob("*.meta.json"))) == 2
    a_train_file = Path(load_corpus(text_cfg(corpus_dir)).train["name"][0])
    a_train_file.write_text("the cat changed its mind\n" * 30)
    build_dataset(text_cfg(corpus_dir), seq_len=16, cache_dir=cache, seed=0)
    assert len(list((cache / "tokenizers").glob("*.json.meta.json"))) == 3
    assert len(list((cache / "tokens").glob("*.meta.json"))) == 3


@pytest.mark.parametrize("damage", ["flip_token_bytes", "truncate_tokens", "garble_tokenizer", "garble_meta"])
def test_corrupted_cache_is_detected_and_rebuilt(corpus_dir: Path, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture):
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    good = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    expected = {split: np.array(t) for split, t in good.tokens.items()}
    del good  # drop the memmaps before editing their files
    train_bin = next((cache / "tokens").glob("*.train.bin"))
    if damage == "flip_token_bytes":
        raw = bytearray(train_bin.read_bytes())
        raw[10:20] = bytes(b ^ 0xFF for b in raw[10:20])  # same size: only the hash can tell
        train_bin.write_bytes(bytes(raw))
    elif damage == "truncate_tokens":
        train_bin.write_bytes(train_bin.read_bytes()[:-7])
    elif damage == "garble_tokenizer":
        tok_json = next((cache / "tokenizers").glob("*.json"))
        tok_json.write_text(tok_json.read_text()[:-50])
    else:
        next((cache / "tokens").glob("*.meta.json")).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="data"):
        rebuilt = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    assert "rebuilding" in caplog.text, caplog.text
    for split, tokens in expected.items():
        np.testing.assert_array_equal(rebuilt.tokens[split], tokens)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="data"):
        build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    assert "rebuilding" not in caplog.text  # the rebuilt entry is intact


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
    (cache / "tokens" / f".{train_bin.name}.4242.tmp").write_bytes(b"\x00" * 64)  # another killed writer's temp
    with caplog.at_level(logging.INFO, logger="data"):
        again = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    assert "tokenised" in caplog.text  # rebuilt, and said so
    for split, tokens in expected.items():
        np.testing.assert_array_equal(again.tokens[split], tokens)


def test_build_lock_lets_one_builder_in_at_a_time(tmp_path):
    lock, inside, order = tmp_path / "entry.lock", threading.Event(), []

    def second_builder():
        inside.wait()
        with build_lock(lock):  # a lock file of its own opening, as another process would hold
            order.append("second")

    other = threading.Thread(target=second_builder)
    other.start()
    with build_lock(lock):
        inside.set()
        other.join(timeout=0.5)  # blocked while we hold the lock
        assert other.is_alive() and order == []
        order.append("first")
    other.join(timeout=10)
    assert order == ["first", "second"]
