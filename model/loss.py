"""Cross-entropy over the vocabulary without the whole (tokens × vocab) logits: chunk by chunk.

At 128K tokens and GPT-2's 50K vocabulary the logits are 6.6G numbers: 13 GB in bf16, 26 GB
again as the float32 copy the loss reads, and as much again for their gradient. Here the
final hidden states are cut into chunks of `chunk` tokens; each chunk's logits and loss are
computed under torch.utils.checkpoint, which keeps only the chunk's inputs and rebuilds its
logits in the backward, so at any moment one chunk's logits exist. The price is the lm_head
matmul run twice (2·V·C FLOPs per token more; model/flops.py counts it in the HFU).

The result is the mean over the targets that are not `ignore_index`, as F.cross_entropy:
the same loss and gradients up to float rounding (the chunk sums are added in another order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # F.cross_entropy's default: targets with this id count neither in the sum nor the mean


def _chunk_loss_sum(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    logits = F.linear(hidden, weight)  # (chunk, V); bf16 under autocast
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")


# Eager on purpose, also inside a compiled model: compiled by inductor, the checkpointed chunks no
# longer bound the memory (CPU, GPT with a 50K vocabulary at 8192 tokens, chunks of 1024: peak RSS
# 3.23 GiB compiled, 1.19 GiB with the loss left eager, 1.12 GiB all eager). The loss is a few
# large matmuls per chunk, which lose nothing to running outside the graph.
@torch.compiler.disable
def chunked_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int) -> Tensor:
    """Mean cross-entropy of `hidden` (..., C) @ `weight` (V, C)ᵀ against `targets` (...), `chunk` tokens at a time."""
    if chunk <= 0:
        raise ValueError(f"loss_chunk must be a positive number of tokens (got {chunk})")
    hidden, targets = hidden.flatten(0, -2), targets.flatten()  # (T, C), (T,)
    total = None
    for start in range(0, targets.numel(), chunk):
        h, y = hidden[start : start + chunk], targets[start : start + chunk]
        if hidden.requires_grad:  # training: keep the chunk's inputs only, rebuild its logits in the backward
            part = checkpoint(_chunk_loss_sum, h, weight, y, use_reentrant=False)
        else:
            part = _chunk_loss_sum(h, weight, y)
        total = part if total is None else total + part
    return total / (targets != IGNORE_INDEX).sum()
