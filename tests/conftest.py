"""Shared fixtures: the real Hydra configs, shrunk to CPU size, and a small learnable token source."""

import os
from pathlib import Path
from typing import Callable

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

os.environ.setdefault("WANDB_SILENT", "true")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

# Small enough for seconds on 2 CPU cores, flash attention included (Triton interpreter).
SHRINK = [
    "model=tiny", "model.n_layer=1", "seq_len=32", "batch_size=4", "grad_accum=1", "steps=6",
    "lr=1e-2", "min_lr=1e-3", "warmup_steps=1", "eval_every=0", "eval_steps=2", "ckpt_every=0",
    "log_every=1", "logger=none", "device=cpu", "dtype=fp32", "compile=false",
]


def compose_config(*overrides: str) -> DictConfig:
    """configs/config.yaml composed with `overrides`, exactly as `python train.py <overrides>` would."""
    import training  # noqa: F401  registers the schema that configs/ names (training/schema.py); here, not at
    # the top, so the tests of other packages do not pay for importing the trainer
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def tiny_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    """Factory: the real config shrunk to a tiny CPU run writing into tmp_path, plus overrides."""

    def make(*overrides: str) -> DictConfig:
        where = [f"out_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}"]
        return compose_config(*SHRINK, *where, *overrides)

    return make


class PatternDataset:
    """The TokenDataset interface over a learnable corpus, for tests of the loop alone.

    The corpus is a fixed random walk where token t is followed by succ[t] 90% of the time, so
    a model can drop well below the uniform loss log(vocab) within a few steps. Batches are a
    pure function of (seed, split, step), like data.build_dataset's.
    """

    def __init__(self, seq_len: int, vocab_size: int = 48, n_tokens: int = 4096, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        succ = torch.randperm(vocab_size, generator=g)
        jumps = torch.rand(n_tokens, generator=g) < 0.1
        noise = torch.randint(vocab_size, (n_tokens,), generator=g)
        tokens = [0]
        for i in range(1, n_tokens):
            tokens.append(int(noise[i]) if jumps[i] else int(succ[tokens[-1]]))
        self.tokens = torch.tensor(tokens)
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample_batch(self, split: str, batch_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        half = len(self.tokens) // 2  # first half train, second half val
        base = 0 if split == "train" else half
        g = torch.Generator().manual_seed((self.seed * 2 + (split == "val")) * 1_000_003 + step)
        starts = base + torch.randint(half - self.seq_len - 1, (batch_size,), generator=g)
        windows = torch.stack([self.tokens[s : s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]


@pytest.fixture
def pattern_data(monkeypatch: pytest.MonkeyPatch) -> Callable[..., PatternDataset]:
    """Make train() read PatternDataset instead of data.build_dataset; returns the factory used."""
    import training.setup

    def build(data_cfg: DictConfig, seq_len: int, cache_dir: Path, seed: int) -> PatternDataset:
        return PatternDataset(seq_len, seed=seed)

    monkeypatch.setattr(training.setup, "build_dataset", build)
    return build
