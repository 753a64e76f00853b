"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], device: torch.device
) -> torch.optim.AdamW:
    """AdamW; decay only on 2-D+ tensors (matmul weights, embeddings), not on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # fused=True runs one CUDA kernel for all parameters instead of a loop of small ones.
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device.type == "cuda")


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine down to min_lr."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
