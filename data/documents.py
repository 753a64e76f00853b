"""Document ids and per-document positions for windows cut from a stream of packed documents.

The token files hold documents back to back, each followed by <|endoftext|> (data/dataset.py), and a
training window starts anywhere. For `data.document_mask`, each position of a window gets the index
of its document within the window: the EOT token closes its document (it belongs to the one it
ends, as in Megatron's reset-attention-mask), and the next token opens a new one. Ids are derived
from the tokens themselves, on whatever device the batch is, so they can never drift from the data.
"""
from __future__ import annotations

import torch
from torch import Tensor


def document_ids(tokens: Tensor, eot_id: int) -> Tensor:
    """(..., N) int32: how many EOT tokens come before each position in its row."""
    eot = (tokens == eot_id).to(torch.int32)
    return (eot.cumsum(-1) - eot).to(torch.int32)


def document_positions(ids: Tensor) -> Tensor:
    """(..., N) int64: each position's offset from the first position of its document (ids sorted
    along the last dim, as document_ids gives them), for `data.reset_positions`."""
    n = ids.shape[-1]
    pos = torch.arange(n, device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[..., 1:] = ids[..., 1:] != ids[..., :-1]
    # the last document start at or before each position: a running max over start positions
    first = torch.where(starts, pos, torch.zeros_like(pos)).cummax(-1).values
    return pos - first
