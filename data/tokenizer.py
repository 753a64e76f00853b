"""Byte-level BPE (GPT-2's scheme) trained with `tokenizers` on the train split, cached on disk.

Byte-level means the base alphabet is the 256 byte values, so any text (U+FFFD from bad bytes
included) encodes without an unknown token and decodes back exactly. `<|endoftext|>` separates
documents in the token stream. The cache key is the train split's fingerprint plus every training
setting, so a changed corpus or vocab size trains a new tokenizer instead of reusing a wrong one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import datasets
import tokenizers
from omegaconf import DictConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.cache import build_lock, digest, load_meta, write_meta
from data.files import atomic_path

log = logging.getLogger(__name__)

EOT = "<|endoftext|>"  # document separator, as in GPT-2
MIN_VOCAB = 257  # 256 byte tokens + EOT
RECIPE = 1  # bump when train_bpe changes, so caches built by the old recipe are not reused


def train_bpe(texts: Iterable[list[str]], vocab_size: int, min_frequency: int) -> Tokenizer:
    """Train a byte-level BPE on batches of texts. On a small corpus the vocab may end below vocab_size."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(
            f"data.vocab_size={vocab_size} is too small: byte-level BPE needs at least {MIN_VOCAB} (256 bytes + {EOT})"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # keep text exactly as written
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen in training or not
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def get_tokenizer(train: datasets.Dataset, train_fingerprint: str, cfg: DictConfig, cache_dir: Path) -> tuple[Tokenizer, Path]:
    """The cached tokenizer for this train split and these settings, trained on first use."""
    settings = {
        "vocab_size": int(cfg.vocab_size), "min_frequency": int(cfg.min_frequency),
        "recipe": RECIPE, "tokenizers": tokenizers.__version__,  # another version may merge differently
    }
    path = cache_dir / "tokenizers" / f"bpe-{digest(train_fingerprint, settings)}.json"
    meta_path = path.with_name(path.name + ".meta.json")
    with build_lock(path.with_name(path.name + ".lock")):
        if load_meta(meta_path) is not None:
            return Tokenizer.from_file(str(path)), path
        start = time.perf_counter()
        log.info("training byte-level BPE tokenizer (vocab %d) on %d train documents ...", cfg.vocab_size, len(train))
        tok = train_bpe((batch["text"] for batch in train.iter(batch_size=256)), int(cfg.vocab_size), int(cfg.min_frequency))
        with atomic_path(path) as tmp:
            tok.save(str(tmp))
        write_meta(meta_path, [path], {"settings": settings, "train_fingerprint": train_fingerprint})
        log.info("tokenizer: %d tokens in %.1f s -> %s", tok.get_vocab_size(), time.perf_counter() - start, path)
    return tok, path
