"""FlashAttention-2 in Triton: exact softmax(Q Kᵀ · scale) V without the N×N matrix.

Read in this order: forward.py (the forward kernel and its online-softmax equations), backward.py
(delta, the key-block kernel for dK/dV, the dQ kernel, and the two backward schedules),
tiles.py (helpers both share: operand rounding, the causal key range, pointer vs TMA loads),
launch.py (the tuned launch table and the launchers), op.py (the torch custom ops, autograd,
FLOP formulas, and the eager path around them), and this file: the public functions and their input checks.

Under the causal mask the programs differ in length; REVERSE in the launch config starts the
longest first (the last query blocks; the key-block kernels already start at theirs).

Conventions: inputs in SDPA layout (batch, heads, seqlen, head_dim), any strides. Causal masks
align bottom-right: query i sees keys j <= i + seqlen_k − seqlen_q (flash-attn's convention). A
row that sees no key outputs zeros, has LSE = +inf, and gets zero gradients. NaN/Inf inputs are not
cleaned: a row whose scores hold a NaN or +inf, or are all −inf, comes out NaN as in softmax. Head
dims that are not powers of two are padded inside the kernel with masked loads.

Masks beyond causal (masks.py, tiles.py): a sliding window (left, right) and document ids, combined
with causal by AND; tiles they hide entirely are skipped, so the work falls with the visible pairs.
"""
from __future__ import annotations

import math

import torch

from kernels.flash_attn.launch import interpreting
from kernels.flash_attn.op import attention_bwd, attention_fwd
from kernels.flash_attn.tiles import LN2, LOG2E

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

__all__ = ["flash_attention", "flash_attn_forward", "flash_attn_backward", "check_inputs", "check_masks"]


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None, deterministic: bool | None = None,
) -> None:
    """Raise TypeError/ValueError, saying what to change, unless the kernels can take q, k, v."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim) like scaled_dot_product_attention, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flash_attention supports float16, bfloat16 and float32")
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); every dimension must be >= 1")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    # meta tensors carry shapes only (FLOP counting, tracing): the op's fake impl answers, no kernel runs
    if q.device.type not in ("cuda", "meta") and not interpreting():
        raise ValueError(f"q is on {q.device}: the Triton kernel needs a CUDA device, or TRITON_INTERPRET=1 set before importing kernels to run on the CPU")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"batch sizes differ: q has {q.shape[0]}, k and v have {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"head_dim differs: q has {q.shape[3]}, k and v have {k.shape[3]}")
    if q.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim is {q.shape[3]}; flash_attention supports head_dim up to {MAX_HEAD_DIM}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q has {q.shape[1]} heads, which is not a multiple of the {k.shape[1]} heads of k and v (grouped-query attention needs heads_q % heads_kv == 0)")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be None, True or False, got {type(deterministic).__name__}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")


def check_masks(q: torch.Tensor, k: torch.Tensor, window_size: tuple[int, int], document_ids: torch.Tensor | None) -> None:
    """Raise TypeError/ValueError, saying what to change, unless window_size and document_ids are valid for q, k."""
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        raise TypeError(f"window_size must be a pair of ints (left, right), -1 for unlimited, got {window_size!r}")
    if min(window_size) < -1:
        raise ValueError(f"window_size values must be >= -1 (-1: unlimited on that side), got {tuple(window_size)}")
    if document_ids is None:
        return
    if not isinstance(document_ids, torch.Tensor):
        raise TypeError(f"document_ids must be a torch.Tensor of integer ids or None, got {type(document_ids).__name__}")
    if document_ids.dtype.is_floating_point or document_ids.dtype.is_complex or document_ids.dtype == torch.bool:
        raise TypeError(f"document_ids must hold integers (e.g. torch.int32), got {document_ids.dtype}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"document_ids needs seqlen_q == seqlen_k (one id per position), got {q.shape[2]} queries and {k.shape[2]} keys")
    if document_ids.shape != (q.shape[0], q.shape[2]):
        raise ValueError(f"document_ids must have shape (batch, seqlen) = {(q.shape[0], q.shape[2])}, got {tuple(document_ids.shape)}")
    if document_ids.device != q.device:
        raise ValueError(f"document_ids is on {document_ids.device}, q on {q.device}: they must be on one device")


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _schedule(deterministic: bool | None) -> str:
    """The backward schedule (launch.SCHEDULES) for the `deterministic` argument. None follows
    PyTorch's switch, torch.use_deterministic_algorithms, as PyTorch's own kernels do."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return "two_pass" if deterministic else "fastest"


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None,
    deterministic: bool | None = None, window_size: tuple[int, int] = (-1, -1), document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact attention softmax(q kᵀ · softmax_scale) v, computed tile by tile in SRAM.

    Args:
        q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim), with
            heads_q a multiple of heads_kv (query head h reads kv head h // (heads_q // heads_kv)).
            float16, bfloat16 or float32, head_dim 1..256, any strides.
        causal: mask keys after the query, aligned bottom-right when seqlen_q != seqlen_k
            (query i sees keys j <= i + seqlen_k - seqlen_q); rows that see no key give zeros.
        softmax_scale: defaults to 1 / sqrt(head_dim).
        deterministic: True runs the two-pass backward, bitwise repeatable (7 matmuls). False runs
            the fastest exact schedule for this GPU, head dim and dtype (launch.fastest_schedule):
            where that is the single-pass backward (5 matmuls), dQ is summed with float32 atomic
            adds in whatever order the GPU schedules them, so its last bits may differ from run
            to run. None (default) follows torch.are_deterministic_algorithms_enabled(), as
            PyTorch's own kernels do. The forward is the same either way.
        window_size: (left, right), a sliding window: query i sees key j iff
            i + off − left <= j <= i + off + right, off = seqlen_k − seqlen_q, −1 = unlimited on that
            side; causal caps right at 0 (flash-attn's convention). Rows whose window holds no key give zeros.
        document_ids: integer ids (batch, seqlen), seqlen_q == seqlen_k: query i sees key j only if
            their ids are equal (packed sequences), combined with causal and the window by AND.

    Returns:
        (batch, heads_q, seqlen_q, head_dim), in q's dtype and memory layout. Differentiable in
        q, k and v; usable under torch.compile(fullgraph=True).
    """
    check_inputs(q, k, v, causal, softmax_scale, deterministic)
    check_masks(q, k, window_size, document_ids)
    o, _ = attention_fwd(q, k, v, causal, _scale(q, softmax_scale), _schedule(deterministic), *window_size, document_ids)
    return o


def flash_attn_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1), document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward pass alone: (out, lse), without autograd history (see flash_attn_backward).

    For callers that combine partial results, such as context parallelism (ring attention), where
    each step attends to one block of keys: lse (float32, (batch, heads_q, seqlen_q), natural log)
    is each row's log Σ_j e^{scale·s_j}, so results over disjoint key sets merge exactly as
    lse = logaddexp(lse_1, lse_2), out = e^{lse_1 − lse}·out_1 + e^{lse_2 − lse}·out_2.
    A row that sees no key has out = 0 and lse = +inf (so the backward gives it zero gradients):
    a merge must read that +inf as −inf, the log of an empty sum. Arguments as flash_attention's.
    """
    check_inputs(q, k, v, causal, softmax_scale)
    check_masks(q, k, window_size, document_ids)
    with torch.no_grad():
        out, lse2 = attention_fwd(q, k, v, causal, _scale(q, softmax_scale), "two_pass", *window_size, document_ids)
    return out, lse2 * LN2.value  # the kernels keep it in base 2


def flash_attn_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool = False, softmax_scale: float | None = None, deterministic: bool | None = None,
    window_size: tuple[int, int] = (-1, -1), document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of flash_attention for the output gradient dout, from flash_attn_forward's
    out and lse on the same inputs (the probabilities are recomputed from q, k and lse).

    dout and out: q's shape and dtype; lse: float32 (batch, heads_q, seqlen_q). For the merged
    result of several key blocks, pass the merged out and lse with each block's k, v: delta =
    rowsum(dout ∘ out) and P = e^{S − lse} are then the full attention's, and each call returns
    that block's dk, dv and its share of dq. Other arguments as flash_attention's.
    """
    check_inputs(q, k, v, causal, softmax_scale, deterministic)
    check_masks(q, k, window_size, document_ids)
    for name, t, shape, dtype in (("dout", dout, q.shape, q.dtype), ("out", out, q.shape, q.dtype), ("lse", lse, q.shape[:3], torch.float32)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != shape or t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} of shape {tuple(shape)}, got {t.dtype} of shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: they must be on one device")
    with torch.no_grad():
        return attention_bwd(dout, q, k, v, out, lse * LOG2E.value, causal, _scale(q, softmax_scale),
                              _schedule(deterministic), *window_size, document_ids)
