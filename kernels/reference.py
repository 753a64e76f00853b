"""Plain-PyTorch attention, for checking the Triton kernel and for reading the algorithm.

- `attention_reference`: softmax(q kᵀ · scale) v with every N×N tensor materialised, in float64
  by default (the ground truth), or in another dtype (the error any standard implementation
  makes in that precision: the yardstick of the exactness rule in tests).
- `attention_backward_reference`: the gradients by FlashAttention's backward formulas
  (delta = rowsum(dO ∘ O), dS = P ∘ (dP − delta)) in plain tensors of one dtype: the rounding
  that formula itself makes, which the exactness rule also allows the kernel.
- `online_softmax_attention`: the FlashAttention forward in plain tensors, one key block at a
  time with the running max m, running sum l and rescale factor α = e^{m_old − m_new}, returning
  the per-block trace so the worked examples of the docs can be checked by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool, True where query i may see key j: j <= i + seqlen_k - seqlen_q."""
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    return cols <= rows + (seqlen_k - seqlen_q)


def attention_mask(
    seqlen_q: int, seqlen_k: int, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
    document_ids: torch.Tensor | None = None, device: torch.device | str = "cpu",
) -> torch.Tensor | None:
    """Bool mask, True where query i may see key j, broadcastable to (batch, heads, seqlen_q, seqlen_k):
    (seqlen_q, seqlen_k) for positional masks, (batch, 1, seqlen, seqlen) with document ids; None
    when nothing is masked. The window and documents follow flash_attention's contract."""
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if document_ids is not None:
        device = document_ids.device  # the two masks combine, so they live on one device
    mask = None
    if left >= 0 or right >= 0:
        rel = torch.arange(seqlen_k, device=device)[None, :] - torch.arange(seqlen_q, device=device)[:, None] - (seqlen_k - seqlen_q)
        mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
        if left >= 0:
            mask &= rel >= -left
        if right >= 0:
            mask &= rel <= right
    if document_ids is not None:
        same = document_ids[:, None, :, None] == document_ids[:, None, None, :]
        mask = same if mask is None else same & mask
    return mask


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    dtype: torch.dtype | None = torch.float64,
    window_size: tuple[int, int] = (-1, -1),
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention with the same contract as `flash_attention`, computed naively in `dtype`
    (None keeps the inputs' dtype). Differentiable; rows that see no key give zeros."""
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # GQA: head h reads kv head h // group
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    visible = attention_mask(q.shape[2], k.shape[2], causal, window_size, document_ids, q.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
        # a row with no visible key would be softmax(-inf, ..., -inf) = NaN; define it as zeros
        scores = scores.masked_fill(~visible.any(-1, keepdim=True), 0.0)
        probs = torch.softmax(scores, dim=-1) * visible.any(-1, keepdim=True)
    else:
        probs = torch.softmax(scores, dim=-1)
    return probs @ v


def attention_backward_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of `attention_reference` in the inputs' dtype, by the formulas the kernel uses.

    Autograd's softmax backward forms rowsum(P ∘ dP), which is exactly dP when a row sees a single
    key, so there its gradients are free of rounding by construction. FlashAttention forms
    delta = rowsum(dO ∘ O) instead (O is at hand, P is not), and dP − delta then cancels to a
    rounding residue: any implementation of this algorithm in this dtype makes that error."""
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    with torch.no_grad():
        o = attention_reference(q, k, v, causal, softmax_scale, dtype=None, window_size=window_size, document_ids=document_ids)
        scores = (q @ kr.transpose(-2, -1)) * scale
        visible = attention_mask(q.shape[2], k.shape[2], causal, window_size, document_ids, q.device)
        if visible is None:
            visible = torch.ones_like(scores, dtype=torch.bool)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)  # no-key rows: 0
        do = do.to(q.dtype)
        delta = (do * o).sum(-1, keepdim=True)
        ds = probs * (do @ vr.transpose(-2, -1) - delta)
        dq = ds @ kr * scale
        dk = (ds.transpose(-2, -1) @ q * scale).unflatten(1, (k.shape[1], group)).sum(2)
        dv = (probs.transpose(-2, -1) @ do).unflatten(1, (k.shape[1], group)).sum(2)
    return dq, dk, dv


@dataclass
class BlockStep:
    """State of the online softmax after one key block (per query row)."""

    m: torch.Tensor  # running max of the scores seen so far
    l: torch.Tensor  # noqa: E741  (the algorithm's name) running sum of e^{s - m}
    alpha: torch.Tensor  # e^{m_old - m_new}, the factor applied to l and o at this step


def online_softmax_attention(
    scores: torch.Tensor, values: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, list[BlockStep]]:
    """softmax(scores) @ values, one block of `block_size` keys at a time, never holding more
    than one block of scores: the FlashAttention forward without the tiling of queries.

    scores: (..., N) already scaled; values: (N, D) or (N,). Returns (output, lse, trace).
    """
    squeeze = values.dim() == 1
    if squeeze:
        values = values[:, None]
    shape = scores.shape[:-1]
    m = torch.full(shape, float("-inf"), dtype=scores.dtype)
    l = torch.zeros(shape, dtype=scores.dtype)  # noqa: E741
    o = torch.zeros(*shape, values.shape[-1], dtype=scores.dtype)
    trace = []
    for start in range(0, scores.shape[-1], block_size):
        s = scores[..., start:start + block_size]
        m_new = torch.maximum(m, s.max(-1).values)
        alpha = torch.exp(m - m_new)  # how much the old sum shrinks under the new max
        p = torch.exp(s - m_new[..., None])
        l = alpha * l + p.sum(-1)  # noqa: E741
        o = alpha[..., None] * o + p @ values[start:start + block_size].to(scores.dtype)
        m = m_new
        trace.append(BlockStep(m.clone(), l.clone(), alpha))
    out = o / l[..., None]
    return (out[..., 0] if squeeze else out), m + torch.log(l), trace
