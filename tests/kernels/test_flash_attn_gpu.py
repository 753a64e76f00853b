"""Every launch-config class of the kernel on a real GPU, against float64 (the exactness rule).

The CPU interpreter runs any config: only the GPU compiler can fail on one (a pipelined loop
whose trip count the compiler knows to be tiny, a tile that does not fit), and only at the shapes
that pick that config. So this sweeps what picks a config: each head-dim bucket (the padded
BLOCK_D 16, 32, 64, 128, 256, with dims that are not powers of two), query lengths from 1 (the
value Triton specialises as a constant) to beyond a block, key lengths below, between and above
the blocks, MHA/GQA/MQA, the three dtypes, causal and not, TMA loads as the table picks them and
forced off, and both backward schedules. Skipped without CUDA; ~1000 cases, run with -n.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from _attention_checks import check_against_reference, launch_table_changed, make_qkv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: only the GPU compiler can reject a launch config"),
]

HEAD_DIMS = [13, 24, 40, 59, 80, 96, 111, 200]  # buckets 1-16, 17-32, 33-64, 65-128, 129-256 (BLOCK_D 16..256)
SEQLENS_Q = [1, 2, 17, 113, 255]
SEQLENS_K = [1, 239, 1024]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _cases():
    for i, (d, sq, sk, dtype, causal) in enumerate(itertools.product(HEAD_DIMS, SEQLENS_Q, SEQLENS_K, DTYPES, [False, True])):
        heads = HEADS[i % len(HEADS)]  # every head ratio meets every head dim and length, over the sweep
        tma = "off" if (dtype == torch.bfloat16 and i % 2) else "table"
        yield pytest.param(d, sq, sk, heads, dtype, causal, tma,
                           id=f"d{d}-q{sq}-k{sk}-h{heads[0]}:{heads[1]}-{str(dtype)[6:]}-{'causal' if causal else 'full'}-tma_{tma}")


@pytest.mark.parametrize("head_dim,seqlen_q,seqlen_k,heads,dtype,causal,tma", list(_cases()))
def test_shape_class_on_gpu(head_dim, seqlen_q, seqlen_k, heads, dtype, causal, tma):
    q, k, v = make_qkv(1, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype)
    with launch_table_changed(lambda name, config: dict(TMA=False, TMA_DQ=False) if tma == "off" else {}):
        for schedule in ("two_pass", "fused"):
            check_against_reference(q, k, v, causal, schedule=schedule)
