"""Our kernels at forced launch configs: tune_flash.py's grids and paper_table.py's block-size study.

A forced config is an argument of the launchers in kernels.flash_attn.launch (`config=`; None is
the table's choice), so these call the launchers directly instead of the autograd op.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable

import torch
import triton
from torch import Tensor

from bench.impls import AttnFn
from kernels.flash_attn import launch
from kernels.flash_attn.launch import KernelConfig

KernelCall = Callable[[KernelConfig | None], Any]


def block_d(head_dim: int) -> int:
    """head_dim padded as the launchers pad it (a power of two, at least 16 for tl.dot)."""
    return max(16, triton.next_power_of_2(head_dim))


def config(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, documents: bool = False, **fields: Any) -> KernelConfig:
    """The table's config of `kernel` (one of launch.KERNELS) for this shape (`documents`: its
    document-mask variant), with `fields` (BLOCK_M, BLOCK_N, num_warps, num_stages, REVERSE, TMA,
    maxnreg) replaced where given and not None."""
    default = launch.kernel_config(kernel, block_d(head_dim), dtype, causal, documents)
    return dataclasses.replace(default, **{k: v for k, v in fields.items() if v is not None})


def forward_at(cfg: KernelConfig) -> AttnFn:
    """Our forward (no autograd) launched with `cfg`, as an attention function."""

    def attn(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        return launch.forward(q, k, v, causal, q.shape[-1] ** -0.5, config=cfg)[0]

    return attn


def kernel_calls(q: Tensor, k: Tensor, v: Tensor, do: Tensor, causal: bool) -> dict[str, KernelCall]:
    """kernel name -> a call of that kernel alone under a given config, on fixed inputs (o, lse
    and delta computed once at the table's configs). bwd_fused replaces a whole backward, so it is
    called as one: preprocess, dQ zeroing, the fused kernel, dQ cast."""
    scale = q.shape[-1] ** -0.5
    o, lse2 = launch.forward(q, k, v, causal, scale)
    delta = launch.backward_delta(o, do)
    return {
        "fwd": lambda cfg: launch.forward(q, k, v, causal, scale, config=cfg)[0],
        "bwd_dkdv": lambda cfg: launch.backward_dkdv(do, q, k, v, lse2, delta, causal, scale, config=cfg)[0],
        "bwd_dq": lambda cfg: launch.backward_dq(do, q, k, v, o, lse2, causal, scale, config=cfg)[0],
        "bwd_fused": lambda cfg: launch.backward_fused(do, q, k, v, lse2, launch.backward_delta(o, do), causal, scale, config=cfg),
    }


def parse_tile(text: str) -> dict:
    """'64x128x8x3' -> BLOCK_M 64, BLOCK_N 128, 8 warps, 3 stages."""
    try:
        block_m, block_n, warps, stages = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"tile {text!r}: write BLOCK_MxBLOCK_NxWARPSxSTAGES, e.g. 64x128x8x3") from None
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
