"""The attention switch: one signature, three implementations, one mapping keyed by config name.

Every implementation is `attend(q, k, v, causal) -> o` with q, k, v of shape (B, H, N, D) and
o of shape (B, H, N, D), scaled by 1/sqrt(D). `get_attention(name, **options)` turns the
`attention:` config group into such a function; an unknown name raises with the known ones.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel


class AttendFn(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor: ...


def naive_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """softmax(QKᵀ/√d)·V written out, so the (B, H, N, N) scores and probabilities really exist.

    This is the baseline FlashAttention removes: memory grows with N² and each N×N matrix
    makes a round trip through HBM. Under bf16 autocast, softmax runs in fp32, as it would in
    any textbook PyTorch model.
    """
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, Nq, Nk)
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        # Bottom-right aligned like SDPA/flash-attn: query i sees keys j <= i + n_k - n_q.
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H, Nq, D)


def naive_attention_bytes(
    batch: int, heads: int, seq_len: int, n_layer: int, dtype: torch.dtype, device_type: str = "cuda"
) -> tuple[int, int]:
    """(bytes of one (B, H, N, N) matrix in `dtype`, bytes of them autograd keeps over `n_layer` layers).

    What naive_attention leaves for the backward, per layer: the probabilities P, saved by softmax
    and by P·V. In float32 that is one tensor (4 bytes per element). Under CUDA autocast, softmax
    runs and saves P in float32 and P·V saves P cast to bf16/fp16: 4 + 2 bytes per element. (CPU
    autocast keeps softmax in bf16: 2 bytes.) The scores QKᵀ are freed once softmax has run, so
    the peak adds about one layer's scores to what is kept.
    """
    element = torch.finfo(dtype).bits // 8
    matrix = batch * heads * seq_len * seq_len
    kept = 4 + element if element < 4 and device_type == "cuda" else element
    return matrix * element, n_layer * matrix * kept


SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, backend: str = "auto") -> Tensor:
    """torch's scaled_dot_product_attention; `backend` pins one kernel, "auto" lets PyTorch choose."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = None
    if causal and n_q != n_k:  # is_causal aligns top-left; keep the bottom-right convention of the others
        # Imported here: torch.nn.attention.bias imports triton, which must wait for `kernels`.
        from torch.nn.attention.bias import causal_lower_right

        mask, causal = causal_lower_right(n_q, n_k), False
    if backend == "auto":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    # Pinning fails loudly ("No available kernel") if that backend cannot run these inputs.
    with sdpa_kernel(SDPA_BACKENDS[backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def _load_flash(deterministic: bool | str = "auto") -> AttendFn:
    """Our kernel. deterministic: True runs the bitwise-repeatable two-pass backward, False the
    fastest exact schedule (kernels.flash_attn.launch.fastest_schedule), "auto" follows
    torch.use_deterministic_algorithms, as flash_attention's None does."""
    if not (deterministic == "auto" or isinstance(deterministic, bool)):
        raise ValueError(f"attention.deterministic must be auto, true or false (got {deterministic!r})")
    deterministic = None if deterministic == "auto" else deterministic
    # Imported on demand so naive/sdpa work even where the kernel package cannot load.
    from kernels import flash_attention

    def flash(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        return flash_attention(q, k, v, causal=causal, deterministic=deterministic)

    return flash


def _load_sdpa(backend: str = "auto") -> AttendFn:
    if backend != "auto" and backend not in SDPA_BACKENDS:
        raise ValueError(
            f"attention.backend={backend!r} is not one of auto, {', '.join(SDPA_BACKENDS)}"
        )
    return partial(sdpa_attention, backend=backend)


# Config name -> factory taking that group's extra keys (e.g. sdpa's `backend`).
ATTENTION: dict[str, Callable[..., AttendFn]] = {
    "naive": lambda: naive_attention,
    "sdpa": _load_sdpa,
    "flash": _load_flash,
}


def get_attention(name: str, **options: object) -> AttendFn:
    """The attend function for config `attention.name=<name>` with that group's other keys."""
    if name not in ATTENTION:
        raise ValueError(f"attention.name={name!r} is unknown; choose one of {', '.join(ATTENTION)}")
    try:
        return ATTENTION[name](**options)
    except TypeError as err:  # an option this implementation does not take
        raise ValueError(f"attention={name} does not accept options {sorted(options)}: {err}") from err
