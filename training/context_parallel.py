"""Context parallelism: `torchrun --nproc_per_node=2 train.py context_parallel=2` splits every
sequence's tokens over 2 ranks, for sequences whose activations do not fit one GPU.

world = dp × cp. Ranks [d·cp, (d+1)·cp) form context-parallel group d: they read the same rows of
each batch (data-parallel rank d, training.batches) and each keeps 2 of the 2·cp zigzag chunks of
every sequence (kernels.ring.zigzag_indices) with the tokens' global positions. A group's
ranks are neighbours, so the ring's traffic (every layer, forward and backward) stays on one
node's links. DDP or FSDP span all world ranks as they are: every rank's loss is the mean over the
same number of tokens, so the mean of the ranks' gradients is the gradient of the whole batch's
mean loss, and a CP run reaches the one-process run's weights up to float rounding.

Attention: flash runs our ring (kernels/ring.py); sdpa runs PyTorch's own context parallel
(`torch.distributed.tensor.experimental.context_parallel`), which shards the batch itself with its
head-tail load balancer (the same zigzag split) and rings PyTorch's CUDA SDPA kernels. Why ours
does not go through PyTorch's machinery: docs/DESIGN.md, "Context parallelism".
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Callable, ContextManager, Iterator

import torch
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from kernels.ring import ring_flash_attention, zigzag_indices
from model.attention import AttendFn

Shard = Callable[[Tensor, Tensor], ContextManager[tuple[Tensor, Tensor, Tensor | None]]]
CP_ATTENTION = ("flash", "sdpa")  # naive needs every key on one rank: its N×N scores are the point


@contextlib.contextmanager
def whole_sequences(x: Tensor, y: Tensor) -> Iterator[tuple[Tensor, Tensor, None]]:
    """Without context parallelism: the micro-batch as it is, positions 0..N-1 (the model's default)."""
    yield x, y, None


@dataclass(frozen=True)
class ContextParallel:
    """This rank's context-parallel group and how it splits a micro-batch's tokens."""

    mesh: DeviceMesh  # the 1-D "cp" mesh of this rank's group
    attention: str  # flash (our ring) | sdpa (PyTorch's context parallel)
    local_attend: AttendFn  # the one-process attention: FLOP counting runs it on shapes only

    @property
    def degree(self) -> int:
        return self.mesh.size()

    @property
    def rank(self) -> int:
        return self.mesh.get_local_rank()

    @contextlib.contextmanager
    def shard(self, x: Tensor, y: Tensor) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Around one micro-batch's forward *and* backward: this rank's tokens of x, y (B, N) and their
        global positions (B, N / cp). For sdpa, PyTorch's SDPA is rerouted to its ring meanwhile."""
        positions = torch.arange(x.shape[1], device=x.device).expand_as(x).contiguous()
        if self.attention == "sdpa":
            from torch.distributed.tensor.experimental import context_parallel

            buffers = [x, y, positions]  # sharded in place along dim 1, not restored (we drop them after)
            with context_parallel(self.mesh, buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
                yield x, y, positions
            return
        mine = zigzag_indices(x.shape[1], self.degree, self.rank).to(x.device)
        yield x[:, mine], y[:, mine], positions[:, mine]


def setup_context_parallel(cfg: DictConfig, world_size: int, device: torch.device, model: nn.Module) -> ContextParallel:
    """Build the (dp, cp) mesh (a collective: every rank calls it) and give `model` the CP attention.
    Call before wrapping the model (compile, DDP, FSDP)."""
    cp = cfg.context_parallel
    mesh = init_device_mesh(device.type, (world_size // cp, cp), mesh_dim_names=("dp", "cp"))["cp"]
    local = model.blocks[0].attn.attend
    if cfg.attention.name == "flash":
        deterministic = None if cfg.attention.deterministic == "auto" else cfg.attention.deterministic  # as model/attention.py
        attend = partial(ring_flash_attention, group=mesh.get_group(), deterministic=deterministic)
    else:
        attend = partial(_eager, local)
    model.set_attention(attend)
    return ContextParallel(mesh, cfg.attention.name, local)


@torch.compiler.disable  # PyTorch reroutes SDPA through DTensor at call time: keep it out of compiled graphs
def _eager(attend: AttendFn, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    return attend(q, k, v, causal)
