"""Batches as a pure function of the step: what a step trains on, and which rows this rank keeps.

Every rank draws the step's whole batch (data.TokenDataset.sample_batch: batch_size windows, a
function of the seed, split and step) and keeps its own rows, so ranks need no communication for
data, and a checkpoint resumes exactly on any number of ranks.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from data.documents import document_ids, document_positions
from data.tokenizer import EOT
from training.distributed import DistInfo

BatchInputs = Callable[[Tensor], dict[str, Tensor]]  # x -> the model's extra keyword inputs for it


def no_inputs(x: Tensor) -> dict[str, Tensor]:
    return {}


def document_inputs(ds: Any, document_mask: bool, reset_positions: bool) -> BatchInputs:
    """What travels with each batch x to the model: with data.document_mask, document ids from the
    EOT boundaries in x (every attention then stays inside a document); with data.reset_positions,
    positions restarting at each document. Derived from x on its device, so nothing else to keep in step."""
    if not document_mask:
        return no_inputs
    eot = ds.tokenizer.token_to_id(EOT)

    def inputs(x: Tensor) -> dict[str, Tensor]:
        ids = document_ids(x, eot)
        return {"document_ids": ids, "positions": document_positions(ids)} if reset_positions else {"document_ids": ids}

    return inputs


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
