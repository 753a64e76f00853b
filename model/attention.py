"""The attention switch: one signature, three implementations, one mapping keyed by config name.

Every implementation is `attend(q, k, v, causal, document_ids=None) -> o` with q, k, v of shape
(B, H, N, D) and o of shape (B, H, N, D), scaled by 1/sqrt(D). `get_attention(name, **options)`
turns the `attention:` config group into such a function; an unknown name raises with the known ones.

Masks, the same in all three: `attention.window: W` (a causal sliding window: each query sees
itself and the W − 1 keys before it, i.e. flash-attn's window_size=(W − 1, 0)) is bound when the
function is built; `document_ids` (B, N) travel with each batch, and query i then sees key j only
within its document. naive masks its N×N scores; sdpa passes the same boolean mask as attn_mask,
which rules out SDPA's FlashAttention backend and leaves the memory-efficient (or cuDNN) kernel
reading a (B, 1, N, N) mask and computing every tile; flash skips the masked tiles.
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
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, document_ids: Tensor | None = None) -> Tensor: ...


def window_size(window: int | None) -> tuple[int, int]:
    """flash-attn's (left, right) for `attention.window` (None: no window; W: itself and W − 1 keys back)."""
    if window is None:
        return (-1, -1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"attention.window must be null or a positive int (keys each query sees, itself included), got {window!r}")
    return (window - 1, 0)


def visible_mask(n_q: int, n_k: int, causal: bool, window: int | None, document_ids: Tensor | None,
                 device: torch.device) -> Tensor | None:
    """Bool, True where query i sees key j, broadcastable to (B, H, Nq, Nk); None: nothing masked.
    Bottom-right aligned like SDPA/flash-attn: query i is at position i + n_k − n_q among the keys."""
    if not causal and window is None and document_ids is None:
        return None
    rel = torch.arange(n_k, device=device)[None, :] - torch.arange(n_q, device=device)[:, None] - (n_k - n_q)
    visible = rel <= 0 if causal or window is not None else torch.ones_like(rel, dtype=torch.bool)
    if window is not None:
        visible = visible & (rel > -window)
    if document_ids is not None:
        visible = visible & (document_ids[:, None, :, None] == document_ids[:, None, None, :])  # (B, 1, N, N)
    return visible


def naive_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, document_ids: Tensor | None = None,
                    window: int | None = None) -> Tensor:
    """softmax(QKᵀ/√d)·V written out, so the (B, H, N, N) scores and probabilities really exist.

    This is the baseline FlashAttention removes: memory grows with N² and each N×N matrix
    makes a round trip through HBM. Under bf16 autocast, softmax runs in fp32, as it would in
    any textbook PyTorch model.
    """
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, Nq, Nk)
    visible = visible_mask(q.shape[-2], k.shape[-2], causal, window, document_ids, q.device)
    if visible is not None:
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


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, document_ids: Tensor | None = None,
                   backend: str = "auto", window: int | None = None) -> Tensor:
    """torch's scaled_dot_product_attention; `backend` pins one kernel, "auto" lets PyTorch choose.
    A window or document ids go in as a boolean attn_mask (the module docstring says what that costs)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = None
    if window is not None or document_ids is not None:
        mask, causal = visible_mask(n_q, n_k, causal, window, document_ids, q.device), False
    elif causal and n_q != n_k:  # is_causal aligns top-left; keep the bottom-right convention of the others
        # Imported here: torch.nn.attention.bias imports triton, which must wait for `kernels`.
        from torch.nn.attention.bias import causal_lower_right

        mask, causal = causal_lower_right(n_q, n_k), False
    if backend == "auto":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    # Pinning fails loudly ("No available kernel") if that backend cannot run these inputs.
    with sdpa_kernel(SDPA_BACKENDS[backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def _load_naive(window: int | None = None) -> AttendFn:
    window_size(window)  # checks it
    return partial(naive_attention, window=window)


def _load_flash(deterministic: bool | str = "auto", window: int | None = None) -> AttendFn:
    """Our kernel. deterministic: True runs the bitwise-repeatable two-pass backward, False the
    fastest exact schedule (kernels.flash_attn.launch.fastest_schedule), "auto" follows
    torch.use_deterministic_algorithms, as flash_attention's None does."""
    if not (deterministic == "auto" or isinstance(deterministic, bool)):
        raise ValueError(f"attention.deterministic must be auto, true or false (got {deterministic!r})")
    deterministic = None if deterministic == "auto" else deterministic
    left_right = window_size(window)
    # Imported on demand so naive/sdpa work even where the kernel package cannot load.
    from kernels import flash_attention

    def flash(q: Tensor, k: Tensor, v: Tensor, causal: bool, document_ids: Tensor | None = None) -> Tensor:
        return flash_attention(q, k, v, causal=causal, deterministic=deterministic, window_size=left_right,
                               document_ids=document_ids)

    return flash


def _load_sdpa(backend: str = "auto", window: int | None = None) -> AttendFn:
    if backend != "auto" and backend not in SDPA_BACKENDS:
        raise ValueError(
            f"attention.backend={backend!r} is not one of auto, {', '.join(SDPA_BACKENDS)}"
        )
    window_size(window)  # checks it
    return partial(sdpa_attention, backend=backend, window=window)


# Config name -> factory taking that group's extra keys (e.g. sdpa's `backend`).
ATTENTION: dict[str, Callable[..., AttendFn]] = {
    "naive": _load_naive,
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
