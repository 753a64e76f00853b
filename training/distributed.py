"""Several processes, one per device, launched by torchrun: `torchrun --nproc_per_node=8 train.py`.

torchrun starts each process with RANK, LOCAL_RANK and WORLD_SIZE (and MASTER_ADDR/PORT) in its
environment; a plain `python train.py` has none of them, and then everything here is a no-op for
rank 0 of 1. Under torchrun: one process group (NCCL on GPUs, gloo on CPU), device cuda:LOCAL_RANK,
the model replicated (`parallel=ddp`, DistributedDataParallel) or sharded (`parallel=fsdp`, FSDP2's
`fully_shard` per block and at the root), per-step numbers averaged over ranks, and checkpoints in
the single-process layout (full tensors), so they load on any number of ranks.

Data needs no communication: every rank draws the step's whole global batch (a pure function of
the step) and keeps its own rows (training.batches.micro_batches).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

PARALLEL = ("ddp", "fsdp")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank r of world_size; rank 0 alone logs and writes files."""

    rank: int = 0
    local_rank: int = 0  # index of this rank's GPU on its node
    world_size: int = 1
    launched: bool = False  # started by torchrun (even with one process): process group, DDP/FSDP wrapper
    cp: int = 1  # context-parallel degree: groups of cp neighbouring ranks share each sequence's tokens

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """Which rows of a batch this rank reads: the ranks of one context-parallel group read the same."""
        return self.rank // self.cp

    @property
    def dp_size(self) -> int:
        return self.world_size // self.cp


def from_env() -> DistInfo:
    """This process's place, read from torchrun's environment variables; nothing is initialised."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return DistInfo(rank, int(os.environ.get("LOCAL_RANK", rank)), world, launched=True)


def init(info: DistInfo, device: torch.device, timeout_s: float) -> torch.device:
    """Join the process group (once per process: a -m sweep reuses it) and return this rank's device.

    `timeout_s` bounds every collective: a rank that waits longer for the others (one of them hung
    or died without torchrun noticing) fails with a timeout error instead of hanging the job.
    """
    if not info.launched:
        return device
    if device.type == "cuda":
        if info.local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK={info.local_rank} but this node has {torch.cuda.device_count()} GPU(s); "
                "pass torchrun --nproc_per_node at most the GPU count"
            )
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)  # before any CUDA work: NCCL and the allocator use this GPU
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,  # binds NCCL to this rank's GPU now
        )
        log.info("torchrun: %d ranks, %s process group, rank %d on %s", info.world_size, dist.get_backend(),
                 info.rank, device)
    elif (dist.get_backend() == "nccl") != (device.type == "cuda"):
        raise RuntimeError(f"the process group uses {dist.get_backend()}, which cannot serve device={device.type}")
    return device


def quiet_logging(info: DistInfo) -> None:
    """Ranks other than 0 print warnings and errors only, tagged with their rank; rank 0 logs as usual."""
    if info.is_main:
        return
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    if not root.handlers:  # train.py gives these ranks no Hydra logging (see torchrun_process)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[%(asctime)s][rank {info.rank}] %(message)s", "%H:%M:%S"))
        root.addHandler(handler)


@contextlib.contextmanager
def torchrun_process(argv: list[str]) -> Iterator[None]:
    """Around a whole training process (train.py's __main__); a no-op without torchrun.

    Ranks other than 0 get Hydra overrides appended to `argv`: Hydra writes no .hydra/ and no
    train.log for them, and their Hydra run/sweep folder is a temporary one removed at exit, so
    only rank 0 writes into the run folder. On the way out, however the process ends (success,
    exception, sys.exit, Ctrl-C), the process group is destroyed.
    """
    info = from_env()
    scratch = None
    if info.launched and not info.is_main:
        scratch = tempfile.mkdtemp(prefix=f"flash-gpt-rank{info.rank}-")
        argv += [
            f"hydra.run.dir='{scratch}'", f"hydra.sweep.dir='{scratch}'", "hydra.output_subdir=null",
            "hydra/job_logging=none", "hydra/hydra_logging=none",
        ]
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def record_failure(err: BaseException) -> None:
    """Under torchrun, write `err` where the launcher looks, so its closing report shows this rank's
    message (rather than only an exit code). Call from an `except` block."""
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(err)


def broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank (small picklable objects only)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def mean(value: float, device: torch.device) -> float:
    """The average of `value` over ranks (e.g. a loss: every rank holds an equal share of the batch)."""
    return _all_reduce(value, device, dist.ReduceOp.SUM) / dist.get_world_size() if dist.is_initialized() else value


def maximum(value: float, device: torch.device) -> float:
    """The largest `value` over ranks (e.g. a step time: the slowest rank sets the pace)."""
    return _all_reduce(value, device, dist.ReduceOp.MAX) if dist.is_initialized() else value


def _all_reduce(value: float, device: torch.device, op: dist.ReduceOp) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)  # float64: the sum stays exact enough
    dist.all_reduce(t, op=op)
    return t.item()


def parallelize(model: nn.Module, parallel: str, device: torch.device, compile: bool) -> nn.Module:
    """The model the loop calls under torchrun: DDP-wrapped, or sharded in place by FSDP2.

    ddp: every rank holds the whole model; gradients are averaged in buckets during backward.
    fsdp: each block, then the root (embeddings, final norm; lm_head is tied to wte), keeps 1/world
    of its parameters, gathered for its forward and backward and freed after; gradients are
    reduce-scattered. `model` itself becomes the sharded module (its parameters are DTensors).
    """
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return torch.compile(wrapped) if compile else wrapped  # compile outside DDP: DDP's buckets split the graph
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            if compile:
                block.compile()  # in place, before sharding: parameter names stay as they are
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"parallel={parallel!r} is unknown; choose one of {', '.join(PARALLEL)}")


def grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Around one micro-step's forward and backward: with DDP, `sync=False` skips the gradient
    all-reduce (the gradients add up locally; the last micro-step averages the sum once).

    FSDP reduce-scatters every micro-step, which keeps only a shard of each gradient in memory:
    memory is what FSDP is chosen for.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    inner = getattr(model, "_orig_mod", model)  # through torch.compile's wrapper
    return inner.no_sync() if isinstance(inner, DDP) and not sync else contextlib.nullcontext()


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state as a single process would save them: full tensors, the optimizer's
    state keyed by parameter index. `model` is the unwrapped (or FSDP-sharded) module.

    For FSDP this is a collective, to be called on every rank; rank 0 gets the state (on CPU,
    gathered one tensor at a time), the other ranks get empty dicts.
    """
    if not is_sharded(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    named = get_optimizer_state_dict(model, optimizer, options=options)  # keyed by parameter name
    if not named:
        return {}, {}
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    optimizer_state = {
        "state": {index[name]: value for name, value in named["state"].items()},
        "param_groups": [{**g, "params": [index[name] for name in g["params"]]} for g in named["param_groups"]],
    }
    return model_state, optimizer_state


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any], optimizer_state: dict[str, Any]
) -> None:
    """Put a full_state() (or single-process) state into `model` and `optimizer`, sharding it for FSDP."""
    if not is_sharded(model):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)  # moves the moments to the params' device
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)  # every rank holds the full state and keeps its shard
    set_model_state_dict(model, model_state, options=options)
    names = _param_names(model, optimizer)
    named = {
        "state": {names[i]: value for i, value in optimizer_state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optimizer_state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, named, options=options)


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's order: position i is what optimizer.state_dict() calls i."""
    names = {id(p): name for name, p in model.named_parameters()}  # a tied weight: its first name
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

