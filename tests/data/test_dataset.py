"""data/dataset.py: token files that hold every document once, and batches as a pure function of the step."""

from pathlib import Path

import numpy as np
import pytest
import torch
from _corpus import data_cfg, text_cfg, write_corpus

from data import EOT, build_dataset, token_dtype
from data.dataset import TokenDataset


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus"


def test_token_files_hold_every_document_once(corpus_dir: Path, tmp_path: Path):
    ds = build_dataset(text_cfg(corpus_dir), seq_len=16, cache_dir=tmp_path / "cache", seed=0)
    assert ds.tokens["train"].dtype == np.uint16 and isinstance(ds.tokens["train"], np.memmap)
    docs = {}
    for split in ("train", "val"):
        text = ds.tokenizer.decode(ds.tokens[split].tolist(), skip_special_tokens=False)
        assert text.endswith(EOT)
        docs[split] = text.split(EOT)[:-1]
    originals = sorted(p.read_text(encoding="utf-8") for p in corpus_dir.glob("*.txt"))
    assert sorted(docs["train"] + docs["val"]) == originals  # split by file: disjoint, complete, exact
    assert docs["train"] and docs["val"]
    assert ds.vocab_size == ds.tokenizer.get_vocab_size() <= 400
    assert int(ds.tokens["train"].max()) < ds.vocab_size
    counts = {split: ds.num_tokens(split) for split in ("train", "val")}
    assert counts == {split: len(ds.tokens[split]) for split in counts} and min(counts.values()) > 0
    assert f"tokens train {counts['train']:,} / val {counts['val']:,}" in ds.describe()  # the start-of-run line


def test_batches_are_windows_shifted_and_deterministic(corpus_dir: Path, tmp_path: Path):
    seq_len, batch = 24, 6
    ds = build_dataset(text_cfg(corpus_dir), seq_len=seq_len, cache_dir=tmp_path / "cache", seed=3)
    x, y = ds.sample_batch("train", batch, step=5)
    assert x.shape == y.shape == (batch, seq_len) and x.dtype == y.dtype == torch.int64 and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1])
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(ds.tokens["train"], dtype=np.int64), seq_len + 1)
    for row in torch.cat([x, y[:, -1:]], dim=1).numpy():
        assert (windows == row).all(axis=1).any(), "each row must be a contiguous window of the train tokens"

    def same(a, b):
        return all(torch.equal(u, v) for u, v in zip(a, b))

    assert same(ds.sample_batch("train", batch, 5), (x, y))  # stateless: same inputs, same batch
    again = build_dataset(text_cfg(corpus_dir), seq_len=seq_len, cache_dir=tmp_path / "cache", seed=3)
    assert same(again.sample_batch("train", batch, 5), (x, y))  # ...across processes/resumes too
    for other in [("train", batch, 6), ("val", batch, 5)]:
        assert not same(ds.sample_batch(*other), (x, y)), other
    reseeded = build_dataset(text_cfg(corpus_dir), seq_len=seq_len, cache_dir=tmp_path / "cache", seed=4)
    assert not same(reseeded.sample_batch("train", batch, 5), (x, y))
    with pytest.raises(ValueError, match="split='test' is unknown"):
        ds.sample_batch("test", batch, 0)


def test_a_batch_does_not_depend_on_who_draws_it():
    """Under torchrun every rank draws the step's whole batch and keeps its rows (training/batches.py):
    the draw must be the same in every process, and the same as before the per-rank key was removed."""
    tokens = {"train": np.arange(1000, dtype=np.uint16), "val": np.arange(1000, dtype=np.uint16)}
    ds = TokenDataset(tokens, vocab_size=1000, seq_len=8, seed=3, tokenizer=None, info="")
    x, y = ds.sample_batch("train", 4, step=5)
    starts = np.random.default_rng([3, 0, 0, 5, 0]).integers(0, 1000 - 8, size=4)  # seed, windows, train, step, 0
    assert x[:, 0].tolist() == starts.tolist() and torch.equal(y, x + 1)
    with pytest.raises(TypeError):
        ds.sample_batch("train", 4, 5, 1)  # no per-rank argument: ranks slice one batch


def test_corpus_too_small_says_how_many_tokens(corpus_dir: Path, tmp_path: Path):
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    n_val = build_dataset(cfg, seq_len=8, cache_dir=cache, seed=0).num_tokens("val")
    with pytest.raises(ValueError, match=rf"val split has {n_val:,} tokens and one window needs {n_val + 1:,}"):
        build_dataset(cfg, seq_len=n_val, cache_dir=cache, seed=0)
    with pytest.raises(ValueError, match=r"train split has [\d,]+ tokens and one window needs 1,000,001"):
        build_dataset(cfg, seq_len=1_000_000, cache_dir=cache, seed=0)


def test_parallel_map_gives_the_same_tokens(corpus_dir: Path, tmp_path: Path):
    one = build_dataset(text_cfg(corpus_dir), seq_len=16, cache_dir=tmp_path / "a", seed=0)
    two = build_dataset(text_cfg(corpus_dir, num_proc=2), seq_len=16, cache_dir=tmp_path / "b", seed=0)
    for split in ("train", "val"):
        np.testing.assert_array_equal(one.tokens[split], two.tokens[split])


def test_synthetic(tmp_path: Path):
    cfg = data_cfg("synthetic", vocab_size=1000, num_tokens=5000)
    ds = build_dataset(cfg, seq_len=32, cache_dir=tmp_path, seed=1)
    assert ds.tokenizer is None and ds.vocab_size == 1000 and ds.num_tokens("train") == 5000
    x, y = ds.sample_batch("train", 8, step=0)
    assert x.shape == (8, 32) and torch.equal(x[:, 1:], y[:, :-1]) and 0 <= int(x.min()) and int(x.max()) < 1000
    assert torch.equal(build_dataset(cfg, 32, tmp_path, 1).sample_batch("train", 8, 0)[0], x)
    assert len(set(x.flatten().tolist())) > 100  # really random, not a constant
    assert not list(tmp_path.iterdir())  # no tokenizer, no files
    with pytest.raises(ValueError, match="train split has 5,000 tokens.*raise data.num_tokens"):
        build_dataset(cfg, seq_len=5000, cache_dir=tmp_path, seed=1)


def test_token_dtype():
    assert token_dtype(50257) == np.uint16 and token_dtype(2**16) == np.uint16 and token_dtype(2**16 + 1) == np.uint32


def test_datasets_progress_bars_only_on_a_terminal(monkeypatch):
    """Tokenising bars are carriage-return noise in a log file (nohup, a scheduler's output)."""
    import sys

    import datasets

    from data.dataset import _progress_bars_on_terminals

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not datasets.are_progress_bars_disabled()
    with _progress_bars_on_terminals():
        assert datasets.are_progress_bars_disabled()
    assert not datasets.are_progress_bars_disabled()  # the caller's setting comes back
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with _progress_bars_on_terminals():
        assert not datasets.are_progress_bars_disabled()
