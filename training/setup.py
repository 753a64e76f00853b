"""Everything a run needs before its first step, built once: data, model, optimizer, numbers.

setup(cfg): validate -> device (and the process group under torchrun) -> data -> build_model
(with checkpointing and the loss chunking) -> wrap_model -> optimizer (-> resume) -> the derived
numbers logged at start (parameters, tokens per step, model and hardware FLOPs per token, the
MFU denominator, the attention choice).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from filelock import FileLock
from omegaconf import DictConfig
from torch import nn

from data import build_dataset
from model.attention import get_attention, window_size
from model.flops import (
    HFU_CONVENTION,
    MFU_CONVENTION,
    datasheet_peak,
    flops_per_token,
    measure_matmul_flops,
    recompute_flops_per_token,
)
from model.gpt import GPT, GPTConfig
from training import distributed
from training.batches import BatchInputs, document_inputs, no_inputs
from training.checkpoint import resume
from training.config import ConfigError, resolve_compile, resolve_device, resolve_dtype, validate_config
from training.context_parallel import ContextParallel, Shard, setup_context_parallel, whole_sequences
from training.distributed import DistInfo
from training.estimate import StepEstimate, estimate_step, slow_step_warning
from training.memory import rank_estimate, resolve_checkpointing
from training.metrics import attention_label
from training.optim import build_optimizer

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    """Everything the loop needs, built once by setup()."""

    cfg: DictConfig
    out_dir: Path
    device: torch.device
    ds: Any
    raw_model: GPT  # unwrapped (FSDP: sharded in place): what checkpoints store
    model: nn.Module  # what the loop calls (maybe compiled)
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager]
    start_step: int
    flops_per_token: float
    peak_flops: float | None
    derived: dict[str, Any] = field(default_factory=dict)
    dist: DistInfo = field(default_factory=DistInfo)  # this process's rank under torchrun
    estimate: StepEstimate | None = None  # the start-up estimate of a step on a CPU (rank 0); None on a GPU
    cp: ContextParallel | None = None  # context_parallel > 1: this rank's group and token split
    inputs: BatchInputs = no_inputs  # the model's extra inputs per batch (document ids, positions)
    hardware_flops_per_token: float = 0.0  # flops_per_token + what is run again to save memory (HFU)

    @property
    def shard(self) -> Shard:
        """What the loop wraps each micro-batch in: this rank's tokens of it."""
        return self.cp.shard if self.cp else whole_sequences


def build_model(cfg: DictConfig, tokenizer_vocab: int, device: torch.device, dist: DistInfo = DistInfo()) -> GPT:
    """GPT from the model group, seq_len and the attention group, on `device`, seeded by cfg.seed;
    with activation checkpointing as cfg.checkpointing resolves (training/memory.py) and the
    loss in chunks of cfg.loss_chunk tokens."""
    m = cfg.model
    vocab = m.vocab_size if m.vocab_size is not None else 64 * math.ceil(tokenizer_vocab / 64)
    if vocab < tokenizer_vocab:
        raise ConfigError(
            f"model.vocab_size={vocab} is smaller than the tokenizer's {tokenizer_vocab}; raise it or set null"
        )
    gcfg = GPTConfig(m.n_layer, m.n_head, m.n_embd, vocab, cfg.seq_len, m.dropout, m.bias, m.position, m.rope_base)
    attention_options = {k: v for k, v in cfg.attention.items() if k != "name"}
    attend = get_attention(cfg.attention.name, **attention_options)
    checkpointing, why = resolve_checkpointing(cfg, gcfg, device, resolve_dtype(cfg, device), dist)
    log.info("%s", why)
    torch.manual_seed(cfg.seed)
    model = GPT(gcfg, attend).to(device)
    model.set_checkpointing(checkpointing)
    model.loss_chunk = cfg.loss_chunk
    return model


def wrap_model(model: nn.Module, cfg: DictConfig, device: torch.device, dist: DistInfo = DistInfo()) -> nn.Module:
    """What the loop calls: the model, maybe compiled; under torchrun also DDP-wrapped or FSDP-sharded
    (FSDP shards `model` itself, so build the optimizer after this)."""
    compile = resolve_compile(cfg, device)
    if compile:
        log.info("compiling the model with torch.compile (the first steps are slow)")
        torch._dynamo.reset()  # in a -m sweep, drop the previous job's graphs (and its recompile budget)
    if dist.launched:
        return distributed.parallelize(model, cfg.parallel, device, compile)
    return torch.compile(model) if compile else model


def resolve_cache_dir(cfg: DictConfig) -> Path:
    """cfg.cache_dir, relative paths from the repository: one cache wherever train.py is launched from."""
    cache_dir = Path(cfg.cache_dir)
    return cache_dir if cache_dir.is_absolute() else REPO_ROOT / cache_dir


def peak_flops(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """The MFU denominator for one device: configured, else the GPU's datasheet peak, else a matmul
    measured once per (GPU, dtype) and kept in the cache; on CPU none (no MFU).

    A fixed denominator per machine, so MFU ranks runs as tokens/s does: measured at every start
    (as before), it moved by several percent between runs of one H200, enough to reorder runs."""
    if cfg.peak_tflops is not None:
        return cfg.peak_tflops * 1e12, "config peak_tflops"
    if device.type != "cuda":
        return None, "none (CPU: set peak_tflops for an MFU)"
    name = torch.cuda.get_device_name(device)
    if (peak := datasheet_peak(name, dtype)) is not None:
        return peak, f"datasheet {name} dense {str(dtype).removeprefix('torch.')}"
    cache_dir = resolve_cache_dir(cfg)
    key = f"{name} {str(dtype).removeprefix('torch.')}"
    peak = cached_value(cache_dir / "peak_flops.json", key, lambda: measure_matmul_flops(device, dtype))
    return peak, f"measured {key} 4096^3 matmul, kept in {cache_dir / 'peak_flops.json'}"


def cached_value(path: Path, key: str, compute: Callable[[], float]) -> float:
    """path's JSON {key: value}: the stored value, else compute() stored under a file lock (ranks
    and concurrent runs of one machine then share one number)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        values = json.loads(path.read_text()) if path.exists() else {}
        if key not in values:
            values[key] = compute()
            path.write_text(json.dumps(values, indent=1))
    return float(values[key])


def setup(cfg: DictConfig) -> Run:
    """Validate, then build data, model, optimizer; restore a checkpoint when resuming."""
    dist = distributed.from_env()
    distributed.quiet_logging(dist)  # ranks > 0: warnings and errors only, tagged with the rank
    validate_config(cfg, dist.world_size)
    dist = dataclasses.replace(dist, cp=cfg.context_parallel)
    device = distributed.init(dist, resolve_device(cfg), cfg.dist_timeout_s)
    # Rank 0's run folder: the other ranks write nothing there, but read checkpoints from it.
    out_dir = Path(distributed.broadcast(str(cfg.out_dir)))
    dtype = resolve_dtype(cfg, device)
    step_time = None
    if device.type == "cpu" and dist.is_main:  # before the data work, so a slow shape is flagged within seconds
        step_time = estimate_step(cfg, dtype, dist.world_size)
        if warning := slow_step_warning(cfg, step_time):
            log.warning("%s", warning)
    cache_dir = resolve_cache_dir(cfg)
    try:
        ds = build_dataset(cfg.data, cfg.seq_len, cache_dir, cfg.seed)
    except ValueError as err:  # corpus too small, missing files...: the user's to fix
        raise ConfigError(f"data={cfg.data.name}: {err}") from err
    model = build_model(cfg, ds.vocab_size, device, dist)
    cp = setup_context_parallel(cfg, dist.world_size, device, model) if dist.cp > 1 else None
    wrapped = wrap_model(model, cfg, device, dist)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), device)
    start_step = resume(cfg, out_dir, model, optimizer) if cfg.resume else 0
    window = window_size(cfg.attention.get("window"))
    fpt = flops_per_token(model.cfg, model.num_params(), window)
    recompute = recompute_flops_per_token(model.cfg, cfg.attention.name, model.checkpointing, cfg.loss_chunk, window)
    hfpt = fpt + sum(recompute.values())
    if model.checkpointing:
        log.info("activation checkpointing: each block keeps its input only and the backward reruns its forward: "
                 "+%.3g FLOPs per token (+%.1f%% over the model's), counted in perf/hfu, not in perf/mfu",
                 recompute["blocks"], 100 * recompute["blocks"] / fpt)
    peak, peak_source = peak_flops(cfg, device, dtype)
    if peak and dist.world_size > 1:  # tokens/s counts every rank's tokens: MFU against all their devices
        peak, peak_source = peak * dist.world_size, f"{peak_source} × {dist.world_size} ranks"
    autocast = lambda: torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)  # noqa: E731
    estimate = rank_estimate(cfg, model.cfg, dtype, model.checkpointing, dist)
    derived = {
        "params": model.num_params(), "params_total": model.num_params(non_embedding=False),
        "vocab_size": model.cfg.vocab_size, "tokenizer_vocab": ds.vocab_size,
        "tokens_per_step": cfg.batch_size * cfg.seq_len, "ranks": dist.world_size,
        "parallel": cfg.parallel if dist.launched else "none",
        "micro_batch": cfg.batch_size // (cfg.grad_accum * dist.dp_size),  # per rank
        "context_parallel": dist.cp, "tokens_per_rank_sequence": cfg.seq_len // dist.cp,
        "estimated_step_gib": round(estimate.total / 2**30, 3),
        "position": model.cfg.position, "checkpointing": "blocks" if model.checkpointing else "none",
        "loss_chunk": cfg.loss_chunk,
        "flops_per_token": fpt, "mfu_convention": MFU_CONVENTION,
        "hardware_flops_per_token": hfpt, "hfu_convention": HFU_CONVENTION,
        "peak_flops": peak, "peak_flops_source": peak_source,
        "attention": attention_label(cfg), "device": str(device),
        "attention_window": cfg.attention.get("window"), "document_mask": cfg.data.document_mask,
        "reset_positions": cfg.data.reset_positions,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "compile": resolve_compile(cfg, device),
        "torch": torch.__version__, "start_step": start_step,
    }
    inputs = document_inputs(ds, cfg.data.document_mask, cfg.data.reset_positions)
    return Run(cfg, out_dir, device, ds, model, wrapped, optimizer, autocast, start_step, fpt, peak, derived, dist, step_time, cp,
               inputs, hfpt)
