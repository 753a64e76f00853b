"""The kernels as PyTorch ops: custom ops (opaque to torch.compile, so fullgraph works), fake
impls (shapes only: meta tensors, tracing), autograd, and FLOP formulas for FlopCounterMode.
The forward op returns (o, lse2), the log-sum-exp in base 2 as the kernels keep it; the backward op
takes it back unchanged."""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils.flop_counter import register_flop_formula

from kernels.flash_attn import launch
from kernels.flops import attention_flops


@torch.library.custom_op("flashgpt::flash_attn_fwd", mutates_args=())
def flash_attn_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, schedule: str = "two_pass",
    window_left: int = -1, window_right: int = -1, document_ids: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # `schedule` (the backward's: launch.SCHEDULES) does not change the forward: it is an input
    # here so that autograd's setup_context can hand it to the backward op
    return launch.forward(q, k, v, causal, scale, window_size=(window_left, window_right), document_ids=document_ids)


@flash_attn_fwd.register_fake
def _(q, k, v, causal, scale, schedule="two_pass", window_left=-1, window_right=-1, document_ids=None):
    batch, heads_q, seqlen_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flashgpt::flash_attn_bwd", mutates_args=())
def flash_attn_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse2: torch.Tensor,
    causal: bool, scale: float, schedule: str = "two_pass",
    window_left: int = -1, window_right: int = -1, document_ids: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch.backward(do, q, k, v, o, lse2, causal, scale, schedule, (window_left, window_right), document_ids)


@flash_attn_bwd.register_fake
def _(do, q, k, v, o, lse2, causal, scale, schedule="two_pass", window_left=-1, window_right=-1, document_ids=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, scale, schedule, window_left, window_right, document_ids = inputs
    o, lse2 = output
    ctx.save_for_backward(q, k, v, o, lse2, document_ids)
    ctx.causal, ctx.scale, ctx.schedule, ctx.window = causal, scale, schedule, (window_left, window_right)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse2, document_ids = ctx.saved_tensors
    dq, dk, dv = flash_attn_bwd(do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.schedule, *ctx.window, document_ids)
    return dq, dk, dv, None, None, None, None, None, None


flash_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


# get_raw: the formulas see the tensors themselves, because the visible pairs under a document
# mask depend on the ids' values (meta/fake ids have none: those count as unmasked, see flops.py)
@register_flop_formula(torch.ops.flashgpt.flash_attn_fwd, get_raw=True)
def _fwd_flops(q, k, v, causal, scale, deterministic=True, window_left=-1, window_right=-1, document_ids=None,
               *args, **kwargs) -> int:
    batch, heads_q, seqlen_q, head_dim = q.shape
    return attention_flops(batch, heads_q, seqlen_q, k.shape[2], head_dim, causal, "fwd",
                           window_size=(window_left, window_right), document_ids=document_ids)


@register_flop_formula(torch.ops.flashgpt.flash_attn_bwd, get_raw=True)
def _bwd_flops(do, q, k, v, o, lse2, causal, scale, deterministic=True, window_left=-1, window_right=-1,
               document_ids=None, *args, **kwargs) -> int:
    # the algorithm's 5 matmuls for both schedules (the two-pass one executes 7; kernels/flops.py)
    batch, heads_q, seqlen_q, head_dim = q.shape
    return attention_flops(batch, heads_q, seqlen_q, k.shape[2], head_dim, causal, "bwd",
                           window_size=(window_left, window_right), document_ids=document_ids)
