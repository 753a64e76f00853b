"""data/sources.py: corpora from the stdlib, local text and the hub; caps, splits, bad files, offline."""

import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
from _corpus import REPO, WORDS, data_cfg, text_cfg, write_corpus

from data import EOT, build_dataset
from data.sources import THIRD_PARTY_DIRS, load_corpus


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus"


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


@pytest.mark.slow
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
