"""training/optim.py: the AdamW parameter groups and the warmup + cosine schedule."""

import pytest
from _tiny import CPU

from model import GPT, GPTConfig
from training.optim import build_optimizer, lr_at


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    lr = lambda s: lr_at(s, lr=1.0, min_lr=0.1, warmup_steps=10, steps=110)  # noqa: E731
    assert [lr(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr(60) == pytest.approx(0.55)  # halfway through the cosine: the midpoint of lr and min_lr
    assert lr(110) == pytest.approx(0.1) and lr(500) == pytest.approx(0.1)
    decay = [lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(1, 2, 16, 32, 8))
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), device=CPU)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))  # tied weight once
