"""The kernels as PyTorch ops: custom ops (opaque to torch.compile, so fullgraph works), fake
impls (shapes only: meta tensors, tracing), autograd, and FLOP formulas for FlopCounterMode.
The forward op returns (o, lse2), the log-sum-exp in base 2 as the kernels keep it; the backward op
takes it back unchanged.

attention_fwd / attention_bwd are what the public functions call. In plain eager code they skip
the custom-op layer and run the launchers under a torch.autograd.Function: on the H200 the
custom op's Python wrapping (schema defaults, alias checks, its autograd, dynamo's disable guard)
cost ~550 µs per fwd+bwd, twice the launches themselves (docs/perf-notes.md, v6). Under
torch.compile, a dispatch mode (FlopCounterMode, fake tensors), tensor subclasses or functorch
they call the custom ops, which those need.
"""
from __future__ import annotations

import contextlib
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
    dq_float32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # dq_float32 (schedules in launch.FLOAT32_DQ_SCHEDULES): dq is their float32 sum, contiguous
    return launch.backward(do, q, k, v, o, lse2, causal, scale, schedule, (window_left, window_right), document_ids,
                           dq_float32)


@flash_attn_bwd.register_fake
def _(do, q, k, v, o, lse2, causal, scale, schedule="two_pass", window_left=-1, window_right=-1, document_ids=None,
      dq_float32=False):
    dq = q.new_empty(q.shape, dtype=torch.float32) if dq_float32 else torch.empty_like(q)
    return dq, torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, scale, schedule, window_left, window_right, document_ids = inputs
    o, lse2 = output
    ctx.save_for_backward(q, k, v, o, lse2, document_ids)
    ctx.causal, ctx.scale, ctx.schedule, ctx.window = causal, scale, schedule, (window_left, window_right)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse2, document_ids = ctx.saved_tensors
    schedule = ctx.schedule
    if schedule == "fastest":  # resolved here (at trace time under torch.compile), for dq_float32
        schedule = launch.fastest_schedule(q, k, document_ids is not None)
    # a schedule that sums dQ in float32 hands the sum over uncast: the cast is then an op of the
    # graph, which Inductor fuses into the kernel that consumes dq (the gradient of the qkv
    # projection's output), one memory pass fewer per layer than a cast of its own
    float32_sum = schedule in launch.FLOAT32_DQ_SCHEDULES
    dq, dk, dv = flash_attn_bwd(do, q, k, v, o, lse2, ctx.causal, ctx.scale, schedule, *ctx.window, document_ids,
                                float32_sum)
    return dq.to(q.dtype), dk, dv, None, None, None, None, None, None


# torch.compile's on-disk caches key a compiled backward by the forward graph only: a change to
# _backward or to flash_attn_bwd's schema is invisible to them (pytorch/pytorch#144344), and a
# warm cache would then run the old backward graph against the new op. A change that an old graph
# cannot run correctly must also change flash_attn_fwd's name or schema. A new argument whose
# default keeps the old behaviour (dq_float32) is safe: an old graph just doesn't pass it. Going
# back to an older commit with a newer warm cache is not: set TORCHINDUCTOR_CACHE_DIR, or clear it.
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


def _plain_eager(*tensors: Optional[torch.Tensor]) -> bool:
    """May the launchers run without the custom-op layer? Only for plain tensors with data (meta
    tensors need the fake impl) in eager code: is_compiling comes first so that dynamo, tracing
    this, folds it and reads nothing else. tensors[0] decides the device (one for all: check_inputs)."""
    return not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active() or tensors[0].is_meta
                or any(t is not None and type(t) is not torch.Tensor for t in tensors))


def _profiled(name: str) -> contextlib.AbstractContextManager:
    """The custom op's name as a profiler range, so profiles (training/profiling.py finds attention
    by these names) read the same on both paths; free when no profiler runs."""
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


class _EagerAttention(torch.autograd.Function):
    """flash_attn_fwd with its autograd, minus the custom-op layer (attention_fwd says when)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, schedule, window_left, window_right, document_ids):
        with _profiled("flashgpt::flash_attn_fwd"):
            o, lse2 = launch.forward(q, k, v, causal, scale, window_size=(window_left, window_right),
                                     document_ids=document_ids)
        ctx.mark_non_differentiable(lse2)
        _setup_context(ctx, (q, k, v, causal, scale, schedule, window_left, window_right, document_ids), (o, lse2))
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse2, document_ids = ctx.saved_tensors
        dq, dk, dv = attention_bwd(do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.schedule, *ctx.window, document_ids)
        return dq, dk, dv, None, None, None, None, None, None


def attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, schedule: str = "two_pass",
    window_left: int = -1, window_right: int = -1, document_ids: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse2), differentiable in q, k, v: flash_attn_fwd's contract, by the cheapest path that serves the caller."""
    args = (q, k, v, causal, scale, schedule, window_left, window_right, document_ids)
    if _plain_eager(q, k, v, document_ids):
        return _EagerAttention.apply(*args)
    return flash_attn_fwd(*args)


def attention_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse2: torch.Tensor,
    causal: bool, scale: float, schedule: str = "two_pass",
    window_left: int = -1, window_right: int = -1, document_ids: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): flash_attn_bwd's contract, by the cheapest path that serves the caller."""
    args = (do, q, k, v, o, lse2, causal, scale, schedule, window_left, window_right, document_ids)
    if _plain_eager(do, q, k, v, o, lse2, document_ids):
        with _profiled("flashgpt::flash_attn_bwd"):
            return launch.backward(*args[:9], (window_left, window_right), document_ids)
    return flash_attn_bwd(*args)
