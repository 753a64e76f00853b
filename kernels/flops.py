"""FLOP formulas for attention, written once and used by the kernel's FlopCounterMode
registration, model/flops.py, the training loop, the scripts and the tests.

Convention: one multiply-add is 2 FLOPs. Per (batch, head), with ``pairs`` the number of
(query, key) pairs the softmax can see:

    forward                     S = Q Kᵀ, O = P V                      2 matmuls   4·d·pairs
    backward, P kept (naive)    dV = Pᵀ dO, dP = dO Vᵀ, dQ = dS K,
                                dK = dSᵀ Q                             4 matmuls   8·d·pairs
    backward, recompute (flash) the four above + S = Q Kᵀ again        5 matmuls  10·d·pairs

``pairs`` is N_q·N_k without a mask. With the causal mask (bottom-right aligned: query i sees
keys j <= i + N_k - N_q) it is the exact count of visible pairs, N(N+1)/2 when N_q = N_k = N,
i.e. the usual "halved" figure up to a 1/N term. A sliding window (left, right) and document ids
count their visible pairs the same way (summed over the batch for documents, whose ids differ per
sequence). Softmax and elementwise work are not counted (as in the FlashAttention papers and
PyTorch's FlopCounterMode).

Note: our deterministic backward runs separate dK/dV and dQ passes, so it executes the
QKᵀ and dO Vᵀ products twice (7 matmuls, 14·d·pairs); the single-pass one (deterministic=False,
atomic dQ adds) executes the 5. The formula above is the algorithm's count for both (what
FlopCounterMode reports and what TFLOP/s figures use, as for every FlashAttention
implementation); docs/perf-notes.md discusses the executed count.
"""
from __future__ import annotations

import torch

MATMULS_PER_PASS = {"fwd": 2, "bwd": 5, "bwd_stored_p": 4}


def _window_rows(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row, the first and last key of its window (last < first: it sees none)."""
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    rows = torch.arange(seqlen_q, dtype=torch.int64) + (seqlen_k - seqlen_q)
    first = (rows - left).clamp(min=0) if left >= 0 else torch.zeros_like(rows)
    last = (rows + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(rows, seqlen_k - 1)
    return first, last


def _document_pairs(ids: torch.Tensor, first: torch.Tensor, last: torch.Tensor) -> int:
    """Σ_i #{j in [first_i, last_i] : ids_j == ids_i} for one sequence, in O(N log N): positions
    sorted by (id, position), then two binary searches per row."""
    ids = ids.to("cpu", torch.int64)
    seqlen = ids.numel()
    key = (ids - ids.min()) * seqlen  # (id, position) as one sortable integer
    order = torch.sort(key + torch.arange(seqlen)).values
    hi = torch.searchsorted(order, key + last, right=True)
    lo = torch.searchsorted(order, key + first, right=False)
    return int((hi - lo).clamp(min=0).sum())


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int] = (-1, -1),
                  document_ids: torch.Tensor | None = None) -> int:
    """Number of (query, key) pairs inside the attention mask, for one head: one sequence, or with
    `document_ids` ((seqlen,) or (batch, seqlen), seqlen_q == seqlen_k) the sum over its sequences."""
    if document_ids is not None or tuple(window_size) != (-1, -1):
        first, last = _window_rows(seqlen_q, seqlen_k, causal, tuple(window_size))
        if document_ids is None:
            return int((last - first + 1).clamp(min=0).sum())
        return sum(_document_pairs(row, first, last) for row in document_ids.reshape(-1, seqlen_k))
    if not causal:
        return seqlen_q * seqlen_k
    offset = seqlen_k - seqlen_q  # bottom-right alignment
    # query i sees min(seqlen_k, max(0, i + offset + 1)) keys
    total = 0
    # rows that see a partial prefix: i + offset + 1 in [1, seqlen_k - 1]
    first = max(0, -offset)  # first row that sees at least one key
    full_from = max(0, seqlen_k - offset - 1)  # rows from here on see every key
    partial_end = min(seqlen_q, full_from)
    if partial_end > first:
        lo, hi = first + offset + 1, partial_end - 1 + offset + 1  # arithmetic series of key counts
        total += (lo + hi) * (partial_end - first) // 2
    total += max(0, seqlen_q - max(full_from, first)) * seqlen_k
    return total


def attention_flops(
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    head_dim: int,
    causal: bool,
    pass_: str = "fwd",
    window_size: tuple[int, int] = (-1, -1),
    document_ids: torch.Tensor | None = None,
) -> int:
    """FLOPs of one attention pass over ``batch * heads`` heads (see the module docstring).

    ``pass_`` is "fwd", "bwd" (FlashAttention's recomputing backward, 5 matmuls) or
    "bwd_stored_p" (a backward that kept the N×N probabilities, 4 matmuls). window_size and
    document_ids ((batch, seqlen)) as flash_attention's; ids without values (meta tensors, shape
    tracing) cannot be counted and are left out, which counts an upper bound.
    """
    if pass_ not in MATMULS_PER_PASS:
        raise ValueError(f"pass_ must be one of {sorted(MATMULS_PER_PASS)}, got {pass_!r}")
    if document_ids is not None and document_ids.device.type == "meta":
        document_ids = None
    if document_ids is not None:  # pairs summed over the batch's sequences
        return heads * 2 * MATMULS_PER_PASS[pass_] * head_dim * visible_pairs(seqlen_q, seqlen_k, causal, window_size, document_ids)
    per_head = 2 * MATMULS_PER_PASS[pass_] * head_dim * visible_pairs(seqlen_q, seqlen_k, causal, window_size)
    return batch * heads * per_head
