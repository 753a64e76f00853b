"""bench/hbm.py: the analytic HBM model against measured anchors, and the forward's block-size dependence."""

import pytest

from bench.hbm import forward_hbm_bytes, fused_hbm_bytes, naive_hbm_bytes
from bench.inputs import Shape

PAPER = Shape(batch=64, heads=16, seqlen=1024, head_dim=64, dtype="float16", causal=True)


def test_analytic_hbm_model_against_the_measured_anchors():
    # ncu on an H200 at this shape (docs/results/paper_table.json): naive 41.2 GB; compulsory traffic about 1.6 GB.
    read, write = naive_hbm_bytes(PAPER)
    assert (read + write) / 1e9 == pytest.approx(41.2, rel=0.1)
    nd = 64 * 16 * 1024 * 64 * 2
    for impl in ("flash", "sdpa"):
        read, write = fused_hbm_bytes(PAPER, impl)
        assert 12 * nd <= read + write <= 20 * nd
    non_causal = naive_hbm_bytes(Shape(64, 16, 1024, 64, "float16", causal=False))
    assert sum(non_causal) < sum(naive_hbm_bytes(PAPER))  # no masking passes


def test_fused_backward_moves_more_bytes_than_the_two_pass_one():
    # the float32 dQ buffer is zeroed, read and written back, then cast
    assert sum(fused_hbm_bytes(PAPER, "flash_fused")) > sum(fused_hbm_bytes(PAPER, "flash"))


def test_forward_hbm_model_falls_with_block_m():
    small, large = forward_hbm_bytes(PAPER, 32), forward_hbm_bytes(PAPER, 128)
    assert small[0] > large[0] and small[1] == large[1]
