"""Batches as a pure function of the step: what a step trains on, and which rows this rank keeps.

Every rank draws the step's whole batch (data.TokenDataset.sample_batch: batch_size windows, a
function of the seed, split and step) and keeps its own rows, so ranks need no communication for
data, and a checkpoint resumes exactly on any number of ranks.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import Tensor

from training.distributed import DistInfo


def get_batch(
    ds: Any, split: str, batch_size: int, step: int, device: torch.device, rows: slice = slice(None)
) -> tuple[Tensor, Tensor]:
    """`rows` of batch number `step` of `split`, on device. Stateless: the same arguments give the same batch."""
    x, y = ds.sample_batch(split, batch_size, step)
    return to_device(x[rows], device), to_device(y[rows], device)


def micro_batches(
    ds: Any, batch_size: int, grad_accum: int, step: int, device: torch.device, dist: DistInfo = DistInfo()
) -> Iterator[tuple[Tensor, Tensor]]:
    """This rank's `grad_accum` micro-batches of optimizer step `step`.

    Data-parallel rank d keeps rows [d·s, (d+1)·s) of the step's batch, s = batch_size / dp_size,
    in grad_accum equal slices (without context parallelism d is the rank; with it, a group's ranks
    read the same rows and split their tokens: training.context_parallel). So what a step trains on
    does not depend on the number of ranks or on grad_accum: one GPU and eight reach the same
    weights (up to float rounding).
    """
    x, y = ds.sample_batch("train", batch_size, step)
    share = batch_size // dist.dp_size
    micro = share // grad_accum
    for i in range(grad_accum):
        rows = slice(dist.dp_rank * share + i * micro, dist.dp_rank * share + (i + 1) * micro)
        yield to_device(x[rows], device), to_device(y[rows], device)


def to_device(t: Tensor, device: torch.device) -> Tensor:
    if device.type == "cuda":  # pinned memory lets the copy overlap with compute
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
