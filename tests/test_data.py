"""data/: tiny corpora in temp dirs, no network. Builds cost ~0.1-1 s each (tokenizer vocab 300-400)."""

import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

import data.dataset
import data.tokenizer
from data import EOT, build_dataset, token_dtype, train_bpe
from data.sources import THIRD_PARTY_DIRS, load_corpus

REPO = Path(__file__).resolve().parents[1]
DATA_CONFIGS = sorted((REPO / "configs" / "data").glob("*.yaml"))
WORDS = "the a cat dog sat ran on under mat log quick brown fox jumps over lazy def return import class self".split()


def data_cfg(name: str, **overrides) -> DictConfig:
    """configs/data/<name>.yaml with overrides: the tests exercise the shipped keys, not copies."""
    cfg = OmegaConf.load(REPO / "configs" / "data" / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=False)
    return cfg


def write_corpus(root: Path, files: int = 12, words: int = 300, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(words // 12)]
        path = root / f"doc{i:02d}.txt"
        path.write_text("\n".join(lines) + f"\nünïcödé ✓ {i}\n", encoding="utf-8")
        paths.append(path)
    return paths


def text_cfg(root: Path, **overrides) -> DictConfig:
    return data_cfg("text", **{"paths": [str(root / "*.txt")], "vocab_size": 400, "val_fraction": 0.2, **overrides})


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus"


def test_tokenizer_round_trips_any_text():
    tok = train_bpe([["the cat sat on the mat\n" * 20, "def f(x):\n    return x\n" * 20]], vocab_size=300, min_frequency=2)
    assert 257 <= tok.get_vocab_size() <= 300
    assert tok.token_to_id(EOT) is not None
    for text in ["the cat sat", "  leading spaces\ttabs\n", "unseen: Ωμέγα 漢字 🙂 \ufffd", "\x00\x01 bytes"]:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text, (text, ids)
    assert len(tok.encode("the cat sat on the mat").ids) < len("the cat sat on the mat")  # merges were learned
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_bpe([["x"]], vocab_size=100, min_frequency=2)


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
    assert "train" in ds.describe() and str(ds.num_tokens("train")) not in ("", "0")


def test_second_build_reuses_the_cache(corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    start = time.perf_counter()
    first = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    cold = time.perf_counter() - start

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(data.tokenizer, "train_bpe", no_rebuild)
    monkeypatch.setattr(data.dataset, "_write_tokens", no_rebuild)
    start = time.perf_counter()
    second = build_dataset(cfg, seq_len=16, cache_dir=cache, seed=0)
    warm = time.perf_counter() - start
    for split in ("train", "val"):
        np.testing.assert_array_equal(first.tokens[split], second.tokens[split])
    assert warm < cold, (warm, cold)


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


def test_batches_are_windows_shifted_and_deterministic(corpus_dir: Path, tmp_path: Path):
    seq_len, batch = 24, 6
    ds = build_dataset(text_cfg(corpus_dir), seq_len=seq_len, cache_dir=tmp_path / "cache", seed=3)
    x, y = ds.sample_batch("train", batch, step=5, rank=1)
    assert x.shape == y.shape == (batch, seq_len) and x.dtype == y.dtype == torch.int64 and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1])
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(ds.tokens["train"], dtype=np.int64), seq_len + 1)
    for row in torch.cat([x, y[:, -1:]], dim=1).numpy():
        assert (windows == row).all(axis=1).any(), "each row must be a contiguous window of the train tokens"

    def same(a, b):
        return all(torch.equal(u, v) for u, v in zip(a, b))

    assert same(ds.sample_batch("train", batch, 5, 1), (x, y))  # stateless: same inputs, same batch
    again = build_dataset(text_cfg(corpus_dir), seq_len=seq_len, cache_dir=tmp_path / "cache", seed=3)
    assert same(again.sample_batch("train", batch, 5, 1), (x, y))  # ...across processes/resumes too
    for other in [("train", batch, 5, 0), ("train", batch, 6, 1), ("val", batch, 5, 1)]:
        assert not same(ds.sample_batch(*other), (x, y)), other
    reseeded = build_dataset(text_cfg(corpus_dir), seq_len=seq_len, cache_dir=tmp_path / "cache", seed=4)
    assert not same(reseeded.sample_batch("train", batch, 5, 1), (x, y))
    with pytest.raises(ValueError, match="split='test' is unknown"):
        ds.sample_batch("test", batch, 0)


def test_corpus_too_small_says_how_many_tokens(corpus_dir: Path, tmp_path: Path):
    cfg, cache = text_cfg(corpus_dir), tmp_path / "cache"
    n_val = build_dataset(cfg, seq_len=8, cache_dir=cache, seed=0).num_tokens("val")
    with pytest.raises(ValueError, match=rf"val split has {n_val:,} tokens and one window needs {n_val + 1:,}"):
        build_dataset(cfg, seq_len=n_val, cache_dir=cache, seed=0)
    with pytest.raises(ValueError, match=r"train split has [\d,]+ tokens and one window needs 1,000,001"):
        build_dataset(cfg, seq_len=1_000_000, cache_dir=cache, seed=0)


def test_missing_empty_and_binary_files(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="data.paths is empty"):
        build_dataset(data_cfg("text"), seq_len=8, cache_dir=cache, seed=0)
    with pytest.raises(ValueError, match=r"no file matches \['nowhere/\*\.txt', 'gone\.txt'\]"):
        build_dataset(data_cfg("text", paths=["nowhere/*.txt", "gone.txt"]), seq_len=8, cache_dir=cache, seed=0)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "blank.txt").write_text("  \n\n")
    (tmp_path / "e" / "empty.txt").write_text("")
    with pytest.raises(ValueError, match=r"no text in the 2 matching file\(s\): .*blank\.txt, .*empty\.txt"):
        build_dataset(data_cfg("text", paths=[str(tmp_path / "e")]), seq_len=8, cache_dir=cache, seed=0)
    (tmp_path / "e" / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)))
    with pytest.raises(ValueError, match="no text in the 3"):
        build_dataset(data_cfg("text", paths=[str(tmp_path / "e")]), seq_len=8, cache_dir=cache, seed=0)

    mixed = tmp_path / "mixed"
    write_corpus(mixed, files=6)
    (mixed / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)))
    (mixed / "latin1.txt").write_bytes("café olé the cat\n".encode("latin-1") * 20)
    with caplog.at_level(logging.INFO, logger="data"):
        ds = build_dataset(data_cfg("text", paths=[str(mixed)], vocab_size=300), seq_len=8, cache_dir=cache, seed=0)
    assert "skipped 1 binary file(s)" in caplog.text and "image.bin" in caplog.text
    assert "not valid UTF-8" in caplog.text and "latin1.txt" in caplog.text
    decoded = "".join(ds.tokenizer.decode(ds.tokens[s].tolist()) for s in ("train", "val"))
    assert "caf\ufffd ol\ufffd the cat" in decoded and "PNG" not in decoded


def test_one_file_is_split_by_its_tail(tmp_path: Path):
    path = write_corpus(tmp_path / "one", files=1, words=2400)[0]
    ds = build_dataset(data_cfg("text", paths=[str(path)], vocab_size=300, val_fraction=0.1), seq_len=16, cache_dir=tmp_path / "c", seed=0)
    train, val = (ds.tokenizer.decode(ds.tokens[s].tolist()) for s in ("train", "val"))
    assert train + val == path.read_text(encoding="utf-8")
    assert 0.08 < len(val) / (len(train) + len(val)) < 0.12  # cut at the line break nearest 10%


def test_invalid_knobs(corpus_dir: Path, tmp_path: Path):
    for overrides, message in [
        ({"val_fraction": 0.0}, "val_fraction=0.0 must be between 0 and 1"),
        ({"max_files": 0}, "max_files=0 must be >= 1"),
        ({"vocab_size": 200}, "vocab_size=200 is too small"),
        ({"source": "ftp"}, "data.source='ftp' is unknown"),
    ]:
        with pytest.raises(ValueError, match=message):
            build_dataset(text_cfg(corpus_dir, **overrides), seq_len=8, cache_dir=tmp_path, seed=0)
    with pytest.raises(ValueError, match="seq_len >= 1"):
        build_dataset(text_cfg(corpus_dir), seq_len=0, cache_dir=tmp_path, seed=0)


def test_caps_pick_a_deterministic_subset(tmp_path: Path):
    for i in range(12):  # equal sizes, so the byte cap maps to a known file count
        (tmp_path / f"doc{i:02d}.txt").write_text(f"{i:04d} " + "the cat sat on the mat\n" * 40)
    size = len((tmp_path / "doc00.txt").read_bytes())

    def names(**caps):
        corpus = load_corpus(text_cfg(tmp_path, **caps))
        return sorted(list(corpus.train["name"]) + list(corpus.val["name"]))

    assert len(names(max_files=5)) == 5 and names(max_files=5) == names(max_files=5)
    assert set(names(max_files=5)) < set(names(max_files=6))  # one fixed order, cut at the cap
    assert len(names(max_bytes=3 * size)) == 3 and len(names(max_bytes=2 * size + 1)) == 3  # whole files, up to the cap
    assert len(names()) == 12


def test_stdlib_corpus_is_the_standard_library(tmp_path: Path):
    corpus = load_corpus(data_cfg("stdlib", max_files=20))
    names = list(corpus.train["name"]) + list(corpus.val["name"])
    assert len(names) == 20 and all(n.endswith(".py") for n in names)
    assert not any(set(n.split("/")) & THIRD_PARTY_DIRS for n in names)
    assert "stdlib" in corpus.summary and len(corpus.val) >= 1
    assert load_corpus(data_cfg("stdlib", max_files=20)).fingerprints == corpus.fingerprints  # same pick, same split
    ds = build_dataset(data_cfg("stdlib", max_files=20, vocab_size=512), seq_len=64, cache_dir=tmp_path, seed=0)
    x, _ = ds.sample_batch("train", 2, 0)
    assert "stdlib" in ds.describe() and x.shape == (2, 64)


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


def test_hf_offline_fails_fast_with_advice(tmp_path: Path):
    """With HF_HUB_OFFLINE set before Python starts (as a user would), and no cached copy."""
    script = (
        "from pathlib import Path; from omegaconf import OmegaConf; from data import build_dataset\n"
        f"build_dataset(OmegaConf.load('configs/data/hf.yaml'), 64, Path({str(tmp_path)!r}), 0)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    assert "ValueError: data=hf could not load 'Salesforce/wikitext'" in proc.stderr, proc.stderr[-2000:]
    assert "data=text" in proc.stderr and "data=stdlib" in proc.stderr
    assert elapsed < 60, f"took {elapsed:.0f} s (mostly Python start-up and imports)"


def test_hf_unreachable_hub_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"cannot connect to 127\.0\.0\.1:9.*Offline\? Use data=text"):
        build_dataset(data_cfg("hf"), seq_len=64, cache_dir=tmp_path, seed=0)
    assert time.perf_counter() - start < 10


def test_hf_pipeline_on_a_local_dataset_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """load_dataset on a local folder: the hub path (column, row caps, blank rows, row split) without network."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")  # keep ~/.cache clean
    folder = tmp_path / "local"
    folder.mkdir()
    rows = [{"story": f"story {i}: " + " ".join(random.Random(i).choices(WORDS, k=30)), "id": i} for i in range(60)]
    rows[3]["story"] = "   "  # blank rows are dropped, not turned into lone separators
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = data_cfg("hf", dataset=str(folder), config=None, text_field="story", max_docs=50, vocab_size=300, val_fraction=0.2)
    ds = build_dataset(cfg, seq_len=16, cache_dir=tmp_path / "cache", seed=0)
    docs = [d for s in ("train", "val") for d in ds.tokenizer.decode(ds.tokens[s].tolist(), skip_special_tokens=False).split(EOT)[:-1]]
    assert sorted(docs) == sorted(r["story"] for r in rows[:50] if r["story"].strip())
    assert "49 rows" in ds.describe()
    with pytest.raises(ValueError, match=r"data.text_field='text' is not a column .* \['story', 'id'\]"):
        build_dataset(data_cfg("hf", dataset=str(folder), config=None), seq_len=16, cache_dir=tmp_path / "cache", seed=0)


@pytest.mark.parametrize("path", DATA_CONFIGS, ids=lambda p: p.name)
def test_data_configs_name_and_comment_every_key(path: Path):
    cfg = yaml.safe_load(path.read_text())
    assert cfg["name"] == path.stem and cfg["source"] in {"stdlib", "text", "hf", "synthetic"}
    keys = [line for line in path.read_text().splitlines() if line and not line.startswith((" ", "#"))]
    assert len(keys) == len(cfg)
    assert all(" # " in line for line in keys), [line for line in keys if " # " not in line]
