"""FLOPs of one attention forward and backward as the paper table reports them: the analytic
count of the work each implementation does, and torch's FlopCounterMode count beside it."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.impls import AttnFn
from bench.inputs import Shape

# naive and SDPA's math backend materialise the full N×N scores, mask afterwards, and keep P
MATERIALISING = ("naive", "sdpa_math")


def analytic_gflops(impl: str, shape: Shape) -> tuple[float, float]:
    """(forward, backward) GFLOPs: 4·d·pairs forward; backward 10·d·pairs when S = QKᵀ is
    recomputed (flash, SDPA's fused backends), 8·d·pairs when P is kept (over the full square)."""
    if impl in MATERIALISING:
        return shape.flops("fwd", causal=False) / 1e9, shape.flops("bwd_stored_p", causal=False) / 1e9
    return shape.flops("fwd") / 1e9, shape.flops("bwd") / 1e9


def counted_gflops(attn: AttnFn, shape: Shape, device: torch.device) -> tuple[float, float]:
    """(forward, backward) GFLOPs as torch's FlopCounterMode counts one pass each."""
    q, k, v, do = shape.inputs(device)
    with FlopCounterMode(display=False) as counter:
        o = attn(q, k, v, shape.causal)
    fwd = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        torch.autograd.grad(o, (q, k, v), do)
    return fwd / 1e9, counter.get_total_flops() / 1e9
