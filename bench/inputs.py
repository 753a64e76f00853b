"""What is timed: an attention shape, fresh random inputs, and the forward / forward+backward calls."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor

from bench.cli import parse_dtype
from bench.impls import AttnFn
from kernels.flops import attention_flops


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention call: q, k, v of shape (batch, heads, seqlen, head_dim) in `dtype`."""

    batch: int
    heads: int
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool

    @property
    def elem(self) -> int:
        return parse_dtype(self.dtype).itemsize

    def flops(self, pass_: str, causal: bool | None = None) -> int:
        """kernels.flops' count for `pass_` ('fwd', 'bwd', 'bwd_stored_p'); `causal` overrides the mask."""
        causal = self.causal if causal is None else causal
        return attention_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, causal, pass_)

    def inputs(self, device: torch.device, requires_grad: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return random_inputs(self.batch, self.heads, self.seqlen, self.head_dim, parse_dtype(self.dtype), device, requires_grad)


def random_inputs(
    batch: int, heads: int, seqlen: int, head_dim: int, dtype: torch.dtype, device: torch.device,
    requires_grad: bool = True, seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fresh standard-normal q, k, v (B, H, N, D) and an upstream gradient dO (never zeros:
    kernels that skip work on zeros would time something else)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, heads, seqlen, head_dim)
    q, k, v, do = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, do


def step_fns(attn: AttnFn, q: Tensor, k: Tensor, v: Tensor, do: Tensor, causal: bool) -> tuple[Callable[[], Tensor], Callable[[], None]]:
    """(forward, forward+backward) closures. The forward runs on inputs that require grad, as in
    training, so it saves what its backward needs; gradients are returned by autograd.grad, not
    accumulated into .grad, so repeated calls need no zeroing."""

    def forward() -> Tensor:
        return attn(q, k, v, causal)

    def forward_backward() -> None:
        o = attn(q, k, v, causal)
        torch.autograd.grad(o, (q, k, v), do)

    return forward, forward_backward
