"""Tiny corpora for the data tests: text files in a temp dir and the shipped configs/data/*.yaml."""

import random
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parents[2]
WORDS = "the a cat dog sat ran on under mat log quick brown fox jumps over lazy def return import class self".split()


def data_cfg(name: str, **overrides) -> DictConfig:
    """configs/data/<name>.yaml with overrides: the tests exercise the shipped keys, not copies."""
    cfg = OmegaConf.load(REPO / "configs" / "data" / f"{name}.yaml")
    cfg.pop("defaults")  # names the group's schema (training/schema.py), for Hydra; data/ never reads it
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
