"""bench/flops.py: the paper table's analytic FLOPs, and torch's FlopCounterMode agreeing with them."""

import pytest
import torch

from bench.flops import analytic_gflops, counted_gflops
from bench.impls import make_impl
from bench.inputs import Shape

CPU = torch.device("cpu")
PAPER = Shape(batch=64, heads=16, seqlen=1024, head_dim=64, dtype="float16", causal=True)


def test_analytic_flops_recompute_vs_stored_p():
    n, d, bh = 1024, 64, 64 * 16
    fwd, bwd = analytic_gflops("flash", PAPER)
    assert fwd == pytest.approx(4 * d * n * (n + 1) / 2 * bh / 1e9) and bwd == pytest.approx(2.5 * fwd)
    nfwd, nbwd = analytic_gflops("naive", PAPER)  # the full square, masked after the matmul; P kept
    assert nfwd == pytest.approx(4 * d * n * n * bh / 1e9) and nbwd == pytest.approx(2 * nfwd)


@pytest.mark.parametrize("impl", ["naive", "flash", "flash_fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_flop_counter_agrees_with_analytic(impl, causal):
    shape = Shape(batch=1, heads=2, seqlen=40, head_dim=16, dtype="float32", causal=causal)
    counted = counted_gflops(make_impl(impl), shape, CPU)
    assert counted == pytest.approx(analytic_gflops(impl, shape), rel=1e-9)
