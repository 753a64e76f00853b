"""Helpers the training tests share: a tiny model and optimizer, reading a run's metrics."""

import json
from pathlib import Path

import torch

from model import GPT, GPTConfig
from training.metrics import METRICS_FILE
from training.optim import build_optimizer

CPU = torch.device("cpu")


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def tiny_model_and_optimizer(n_layer: int = 1) -> tuple[GPT, torch.optim.Optimizer]:
    model = GPT(GPTConfig(n_layer, 2, 16, 32, 8))
    return model, build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), CPU)


def read_metrics(out_dir: Path) -> tuple[list[dict], list[dict]]:
    """(per-step training rows, summaries) from metrics.jsonl; the FLOPs line is left out."""
    rows = [json.loads(line) for line in (out_dir / METRICS_FILE).read_text().splitlines()]
    return [r for r in rows if "train/loss" in r], [r["summary"] for r in rows if "summary" in r]
