"""Token streams and batches: the corpus tokenised once into flat memory-mapped files, read as random windows.

Pipeline (each step cached under `cache_dir`, keyed by what it depends on):
  corpus (sources.py) -> tokenizer (tokenizer.py) -> tokens/<key>.{train,val}.bin -> sample_batch
A batch is `batch_size` windows of seq_len+1 tokens at random offsets; x is a window without its
last token, y without its first. The offsets come from an RNG seeded by (seed, split, step)
alone, so a batch is a pure function of the step: resuming needs only the step, and under
torchrun every rank draws the same whole batch and keeps its own rows (training/batches.py),
without talking to the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from omegaconf import DictConfig
from tokenizers import Tokenizer

from data.cache import build_lock, digest, load_meta, write_meta
from data.files import atomic_path
from data.sources import Corpus, load_corpus
from data.tokenizer import EOT, get_tokenizer

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
_WINDOWS, _SYNTHETIC = 0, 1  # RNG purposes: window offsets, synthetic token ids
RECIPE = 1  # bump when the token file layout or the encoding changes


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (half the disk and page cache of uint32), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


@dataclass
class TokenDataset:
    tokens: dict[str, np.ndarray]  # split -> flat token ids (np.memmap for real corpora)
    vocab_size: int  # ids lie in [0, vocab_size); the model's embedding must be at least this big
    seq_len: int
    seed: int
    tokenizer: Tokenizer | None  # None for synthetic data
    info: str

    def num_tokens(self, split: str) -> int:
        return len(self._split(split))

    def describe(self) -> str:
        """One line for the start-of-run log: corpus, tokenizer, token counts, cache files."""
        return self.info

    def sample_batch(self, split: str, batch_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (batch_size, seq_len) int64 on CPU, y[:, i] == x[:, i + 1]; a function of (seed, split, step)."""
        tokens = self._split(split)
        if batch_size < 1 or step < 0:
            raise ValueError(f"need batch_size >= 1 and step >= 0; got {batch_size}, {step}")
        rng = _rng(self.seed, _WINDOWS, split, step)
        starts = rng.integers(0, len(tokens) - self.seq_len, size=batch_size)  # last start leaves seq_len+1 tokens
        windows = torch.from_numpy(np.stack([tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def _split(self, split: str) -> np.ndarray:
        if split not in self.tokens:
            raise ValueError(f"split={split!r} is unknown; use one of {list(self.tokens)}")
        return self.tokens[split]


def build_dataset(data_cfg: DictConfig, seq_len: int, cache_dir: Path, seed: int) -> TokenDataset:
    """Tokens for `data_cfg` (a configs/data/*.yaml), built on first use and cached under cache_dir.

    Raises ValueError with the fix when the corpus cannot serve seq_len, files are missing or empty,
    or a hub dataset is unreachable.
    """
    if seq_len < 1 or seed < 0:
        raise ValueError(f"need seq_len >= 1 and seed >= 0; got seq_len={seq_len}, seed={seed}")
    cache_dir = Path(cache_dir)
    if data_cfg.source == "synthetic":
        vocab = int(data_cfg.vocab_size)
        tokens = _synthetic_tokens(vocab, int(data_cfg.num_tokens), seed)
        info = f"synthetic: uniform random ids < {vocab}, {len(tokens['train']):,} per split"
        ds = TokenDataset(tokens, vocab, seq_len, seed, None, info)
        _check_long_enough(ds, "raise data.num_tokens")
        return ds
    start = time.perf_counter()
    corpus = load_corpus(data_cfg)
    tok, tok_path = get_tokenizer(corpus.train, corpus.fingerprints["train"], data_cfg, cache_dir)
    tokens, token_dir = tokenise(corpus, tok, data_cfg.num_proc, cache_dir)
    counts = " / ".join(f"{split} {len(t):,}" for split, t in tokens.items())
    info = (
        f"{corpus.summary} | byte-level BPE, vocab {tok.get_vocab_size()} ({tok_path}) | "
        f"tokens {counts} ({tokens['train'].dtype} memmap in {token_dir}) | ready in {time.perf_counter() - start:.1f} s"
    )
    ds = TokenDataset(tokens, tok.get_vocab_size(), seq_len, seed, tok, info)
    _check_long_enough(ds, f"add text (data.paths, data.max_bytes, data.max_files) or lower seq_len [{corpus.summary}]")
    return ds


def tokenise(corpus: Corpus, tok: Tokenizer, num_proc: int | None, cache_dir: Path) -> tuple[dict[str, np.memmap], Path]:
    """Flat token files for both splits (documents joined by EOT), cached by corpus + tokenizer fingerprint."""
    key = digest(corpus.fingerprints, digest(tok.to_str()), RECIPE)
    token_dir = cache_dir / "tokens"
    paths = {split: token_dir / f"{key}.{split}.bin" for split in SPLITS}
    meta_path = token_dir / f"{key}.meta.json"
    with build_lock(token_dir / f"{key}.lock"):
        meta = load_meta(meta_path)
        if meta is None:
            start = time.perf_counter()
            dtype = token_dtype(tok.get_vocab_size())
            counts = {
                split: _write_tokens(getattr(corpus, split), tok, dtype, num_proc, paths[split], f"{key}-{split}")
                for split in SPLITS
            }
            meta = {"dtype": dtype.name, "num_tokens": counts, "vocab_size": tok.get_vocab_size()}
            write_meta(meta_path, list(paths.values()), meta)
            log.info("tokenised %s in %.1f s -> %s", counts, time.perf_counter() - start, token_dir)
    return {split: np.memmap(paths[split], dtype=np.dtype(meta["dtype"]), mode="r") for split in SPLITS}, token_dir


def _write_tokens(
    docs: datasets.Dataset, tok: Tokenizer, dtype: np.dtype, num_proc: int | None, path: Path, fingerprint: str
) -> int:
    """Encode docs (EOT after each) with datasets.map and append the ids to `path`; returns the count."""
    eot = tok.token_to_id(EOT)
    num_proc = max(1, num_proc or 1)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[np.ndarray]]:
        return {"ids": [np.array(e.ids + [eot], dtype=dtype) for e in tok.encode_batch(batch["text"])]}

    with _tokenizers_single_threaded(num_proc > 1), _progress_bars_on_terminals():
        encoded = docs.map(
            encode, batched=True, batch_size=256, num_proc=num_proc if num_proc > 1 else None,
            remove_columns=docs.column_names, new_fingerprint=fingerprint,  # skips hashing the closure
            desc=f"tokenising {path.name}",
        )
    count = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        for batch in encoded.with_format("arrow").iter(batch_size=1024):
            ids = pc.list_flatten(batch["ids"]).to_numpy().astype(dtype, copy=False)
            ids.tofile(f)
            count += len(ids)
    return count


@contextlib.contextmanager
def _progress_bars_on_terminals() -> Iterator[None]:
    """datasets draws its bars whatever stderr is; in a log file (nohup, a scheduler) they are
    carriage-return noise, and the log line after tokenising says the same. Bars on terminals only."""
    hide = not sys.stderr.isatty() and not datasets.are_progress_bars_disabled()
    if hide:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if hide:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def _tokenizers_single_threaded(active: bool) -> Iterator[None]:
    """Forked map workers each run one tokenizer thread: set it explicitly, which also silences
    the tokenizers library's fork warning, and restore the caller's setting afterwards."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    if active:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if active:
            if previous is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = previous


def _synthetic_tokens(vocab_size: int, num_tokens: int, seed: int) -> dict[str, np.ndarray]:
    """Uniform random ids: nothing to learn, nothing to read, for measuring speed alone."""
    dtype = token_dtype(vocab_size)
    return {split: _rng(seed, _SYNTHETIC, split).integers(0, vocab_size, num_tokens, dtype=dtype) for split in SPLITS}


def _rng(seed: int, purpose: int, split: str, step: int = 0) -> np.random.Generator:
    """One independent stream per key. The key has a fixed length because SeedSequence gives
    [a, b] and [a, b, 0] the same stream; its last 0 is where a removed per-rank key sat, kept so
    that every batch (and so every run and checkpoint) stays as it was."""
    return np.random.default_rng([seed, purpose, SPLITS.index(split), step, 0])


def _check_long_enough(ds: TokenDataset, remedy: str) -> None:
    for split in SPLITS:
        if ds.num_tokens(split) < ds.seq_len + 1:
            extra = "raise data.val_fraction, " if split == "val" and ds.tokenizer is not None else ""
            raise ValueError(
                f"corpus too small for seq_len={ds.seq_len}: the {split} split has {ds.num_tokens(split):,} tokens "
                f"and one window needs {ds.seq_len + 1:,}; {extra}{remedy}"
            )
