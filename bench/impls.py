"""The attention implementations the scripts compare, by name.

naive, sdpa*, flash and flash_two_pass are the trainer's own (model/attention.py), so the benchmarks
measure exactly what `train.py attention=...` runs; flex is benchmark-only.

    naive           QKᵀ, scale, causal mask, softmax, @V in the input dtype: the paper's "standard attention"
    flash           ours, kernels/flash_attn (Triton), as `attention=flash` runs it by default: the
                    backward's fastest exact schedule (kernels.flash_attn.launch.fastest_schedule)
    flash_two_pass  ours with the deterministic two-pass backward (attention.deterministic=true)
    flash_fused     ours with the single-pass backward forced (dQ by atomic adds; TMA reduce-add on Hopper)
    flash_hopper    ours with the Gluon single-pass backward forced (sm_90 GPUs, head_dim 64 / 128)
    flash_portable  ours on the portable `tl` kernels only (forward.py and the two-pass backward): what
                    runs off Hopper, beside the Gluon fast path that `flash` takes on an H100 / H200
    sdpa            torch scaled_dot_product_attention, PyTorch's own backend choice
    sdpa_cudnn, sdpa_flash, sdpa_efficient, sdpa_math   SDPA pinned to one backend (sdpa_kernel)
    flex            torch FlexAttention under torch.compile; causal through a block mask
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor

from model.attention import get_attention

# An attention implementation as the scripts see it (same signature as model.attention).
AttnFn = Callable[[Tensor, Tensor, Tensor, bool], Tensor]

SDPA_PINNED = {"sdpa_cudnn": "cudnn", "sdpa_flash": "flash", "sdpa_efficient": "efficient", "sdpa_math": "math"}
IMPL_NAMES = ("naive", "flash", "flash_two_pass", "flash_fused", "flash_hopper", "flash_portable", "sdpa", *SDPA_PINNED,
              "flex")
FORCED_SCHEDULES = {"flash_fused": "fused", "flash_hopper": "hopper"}  # ours with a backward schedule forced

# How many compiled variants of one function (one per shape and mask: compiled with dynamic=False,
# as FlexAttention is normally benchmarked) dynamo may keep before it silently falls back to eager.
RECOMPILE_LIMIT = 256


def allow_recompiles() -> None:
    """Raise dynamo's per-function recompile limit (8 by default) to RECOMPILE_LIMIT: a sweep
    compiles one function at many shapes and masks, and past the limit it would run eagerly."""
    dynamo_config = torch._dynamo.config
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))


@functools.cache
def compiled_flex() -> Callable[..., Tensor]:
    """FlexAttention under torch.compile (how it is meant to run: eager it materialises the N×N
    scores), one compiled function for every caller, with room for a variant per shape and mask."""
    from torch.nn.attention.flex_attention import flex_attention

    allow_recompiles()
    return torch.compile(flex_attention, dynamic=False)


def _flex() -> AttnFn:
    from torch.nn.attention.flex_attention import create_block_mask

    compiled = compiled_flex()
    masks: dict[tuple, object] = {}  # block masks are built once per shape, outside the timed calls

    def flex(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        block_mask = None
        if causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            key = (n_q, n_k, str(q.device))
            if key not in masks:
                offset = n_k - n_q  # bottom-right aligned, as flash_attention and SDPA

                def causal_mask(b, h, q_idx, kv_idx):
                    return q_idx + offset >= kv_idx

                masks[key] = create_block_mask(causal_mask, None, None, n_q, n_k, device=q.device)
            block_mask = masks[key]
        return compiled(q, k, v, block_mask=block_mask)

    return flex


def make_impl(name: str) -> AttnFn:
    """The attention function called `name` (see the module docstring)."""
    if name not in IMPL_NAMES:
        raise ValueError(f"unknown attention impl {name!r}; choose from {', '.join(IMPL_NAMES)}")
    if name in SDPA_PINNED:
        return get_attention("sdpa", backend=SDPA_PINNED[name])
    if name == "flex":
        return _flex()
    if name == "flash_two_pass":
        return get_attention("flash", deterministic=True)
    if name in FORCED_SCHEDULES:
        return functools.partial(_flash_scheduled, schedule=FORCED_SCHEDULES[name])
    if name == "flash_portable":
        return _Portable.apply
    return get_attention(name)


class _Portable(torch.autograd.Function):
    """The launchers with the `tl` kernels forced: the public function picks the Gluon ones on
    sm_90, and its ops take no kernel choice (an eager-only benchmark needs none)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        from kernels.flash_attn import launch

        scale = q.shape[-1] ** -0.5
        o, lse2 = launch.forward(q, k, v, causal, scale, kernel="tl")
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        from kernels.flash_attn import launch

        q, k, v, o, lse2 = ctx.saved_tensors
        return (*launch.backward(do, q, k, v, o, lse2, ctx.causal, ctx.scale, "two_pass"), None)


def _flash_scheduled(q: Tensor, k: Tensor, v: Tensor, causal: bool, schedule: str) -> Tensor:
    # the op itself, because the public function only offers "deterministic" or "fastest"
    from kernels.flash_attn.op import flash_attn_fwd

    return flash_attn_fwd(q, k, v, causal, q.shape[-1] ** -0.5, schedule)[0]


def default_impls(device: torch.device) -> list[str]:
    """Every implementation that runs on `device`. flash_hopper only on an sm_90 GPU. On CPU flex is
    left out too: compiling it there needs a C++ toolchain and minutes, which a smoke run should not
    spend (ask for it with --impls flex)."""
    if device.type == "cuda":
        hopper = torch.cuda.get_device_capability(device) == (9, 0)
        return [n for n in IMPL_NAMES if hopper or n != "flash_hopper"]
    return [n for n in IMPL_NAMES if n not in ("flex", "flash_hopper")]
