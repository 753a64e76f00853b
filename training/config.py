"""Checks on the composed config, run before anything heavy, and the choices derived from it.

Types are Hydra's job (training/schema.py: `lr=abc` never composes); here are the checks a type
cannot say: ranges, choices among strings, and rules that span fields.
"""

from __future__ import annotations

import logging

import torch
from omegaconf import DictConfig

from model.attention import ATTENTION, SDPA_BACKENDS
from model.gpt import POSITIONS
from training.context_parallel import CP_ATTENTION
from training.distributed import PARALLEL

log = logging.getLogger(__name__)

CHECKPOINTING = ("none", "blocks", "auto")  # activation checkpointing; auto: training/memory.py decides


class ConfigError(ValueError):
    """A config value the user must change; the message names the field."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _positive_int(cfg: DictConfig, key: str, prefix: str = "") -> None:
    _require(cfg[key] > 0, f"{prefix}{key} must be a positive integer (got {cfg[key]!r})")  # an int: the schema says so


def resolve_batch_size(cfg: DictConfig) -> None:
    """Fill batch_size from tokens_per_step when it is null, so one default fits every seq_len."""
    if cfg.batch_size is not None:
        return
    _positive_int(cfg, "seq_len")
    _positive_int(cfg, "tokens_per_step")
    _require(
        cfg.tokens_per_step % cfg.seq_len == 0,
        f"tokens_per_step={cfg.tokens_per_step} is not a multiple of seq_len={cfg.seq_len}; set batch_size instead",
    )
    cfg.batch_size = cfg.tokens_per_step // cfg.seq_len


def validate_config(cfg: DictConfig, world_size: int = 1) -> None:
    """Raise ConfigError naming the first invalid field; cheap, touches no data or device.

    Resolves a null batch_size first (see resolve_batch_size), in place. `world_size` is the number
    of torchrun processes, which split each step's batch_size sequences between them.
    """
    resolve_batch_size(cfg)
    for key in ("seq_len", "batch_size", "grad_accum", "steps", "context_parallel"):
        _positive_int(cfg, key)
    _require(
        cfg.batch_size % cfg.grad_accum == 0,
        f"batch_size={cfg.batch_size} must be divisible by grad_accum={cfg.grad_accum}",
    )
    _check_context_parallel(cfg, world_size)
    dp = world_size // cfg.context_parallel  # rank groups reading different rows
    split = cfg.grad_accum * dp  # equal micro-batches per step, over all data-parallel ranks
    next_up = -(-cfg.batch_size // split) * split
    ranks = f"ranks / context_parallel × grad_accum = {dp} × {cfg.grad_accum}" if cfg.context_parallel > 1 else \
        f"ranks × grad_accum = {world_size} × {cfg.grad_accum}"
    _require(
        cfg.batch_size % split == 0,
        f"batch_size={cfg.batch_size} must be divisible by {ranks} "
        f"(each rank takes batch_size/{dp} sequences per step), e.g. batch_size={next_up}",
    )
    _require(cfg.parallel in PARALLEL, f"parallel must be one of {', '.join(PARALLEL)} (got {cfg.parallel!r})")
    _require(cfg.dist_timeout_s > 0, f"dist_timeout_s must be > 0 (got {cfg.dist_timeout_s})")
    _require(
        cfg.stop_at is None or 0 < cfg.stop_at <= cfg.steps,
        f"stop_at must be in 1..steps={cfg.steps} or null (got {cfg.stop_at!r})",
    )
    _require(cfg.lr > 0, f"lr must be > 0 (got {cfg.lr})")
    _require(0 <= cfg.min_lr <= cfg.lr, f"min_lr must be in [0, lr={cfg.lr}] (got {cfg.min_lr})")
    for key in ("warmup_steps", "eval_every", "ckpt_every", "grad_clip", "weight_decay"):
        _require(cfg[key] >= 0, f"{key} must be >= 0 (got {cfg[key]})")
    _require(cfg.eval_steps > 0, f"eval_steps must be > 0 (got {cfg.eval_steps})")
    _require(cfg.log_every > 0, f"log_every must be > 0 (got {cfg.log_every})")
    _require(cfg.peak_tflops is None or cfg.peak_tflops > 0, f"peak_tflops must be > 0 or null (got {cfg.peak_tflops})")
    _require(cfg.dtype in ("auto", "bf16", "fp32"), f"dtype must be auto, bf16 or fp32 (got {cfg.dtype!r})")
    _require(cfg.compile in ("auto", True, False), f"compile must be auto, true or false (got {cfg.compile!r})")
    _require(cfg.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda (got {cfg.device!r})")
    _require(cfg.checkpointing in CHECKPOINTING,
             f"checkpointing must be {', '.join(CHECKPOINTING[:-1])} or {CHECKPOINTING[-1]} (got {cfg.checkpointing!r})")
    _require(cfg.loss_chunk >= 0, f"loss_chunk must be >= 0 tokens, 0 for the plain loss (got {cfg.loss_chunk})")
    _require(
        cfg.device != "cuda" or torch.cuda.is_available(),
        "device=cuda but torch sees no CUDA GPU; use device=auto or device=cpu",
    )

    m = cfg.model
    for key in ("n_layer", "n_head", "n_embd"):
        _positive_int(m, key, "model.")
    _require(m.n_embd % m.n_head == 0, f"model.n_head={m.n_head} must divide model.n_embd={m.n_embd}")
    _require(m.vocab_size is None or m.vocab_size > 0, f"model.vocab_size must be > 0 or null (got {m.vocab_size})")
    _require(0 <= m.dropout < 1, f"model.dropout must be in [0, 1) (got {m.dropout})")
    _require(m.position in POSITIONS, f"model.position must be {' or '.join(POSITIONS)} (got {m.position!r})")
    _require(m.rope_base > 1, f"model.rope_base must be > 1 (got {m.rope_base})")
    _require(m.position != "rope" or (m.n_embd // m.n_head) % 2 == 0,
             f"model.position=rope rotates pairs of features: head_dim = n_embd/n_head = {m.n_embd // m.n_head} must be even")

    a = cfg.attention
    _require(a.name in ATTENTION, f"attention.name={a.name!r} is unknown; choose one of {', '.join(ATTENTION)}")
    window = a.get("window")
    _require(window is None or window >= 1, f"attention.window must be null or >= 1 (tokens each query sees, itself included), got {window}")
    d = cfg.data
    _require(not d.document_mask or d.source != "synthetic",
             "data.document_mask=true needs a tokenised corpus: synthetic ids hold no <|endoftext|> boundaries")
    _require(not d.reset_positions or d.document_mask, "data.reset_positions=true needs data.document_mask=true")
    if a.name == "sdpa":
        backends = ("auto", *SDPA_BACKENDS)
        _require(a.backend in backends, f"attention.backend must be one of {', '.join(backends)} (got {a.backend!r})")
    if a.name == "flash":
        _require(a.deterministic == "auto" or isinstance(a.deterministic, bool),
                 f"attention.deterministic must be auto, true or false (got {a.deterministic!r})")


def _check_context_parallel(cfg: DictConfig, world_size: int) -> None:
    """The rules of `context_parallel: N` (training/context_parallel.py)."""
    cp = cfg.context_parallel
    if cp == 1:
        return
    _require(not cfg.data.document_mask and cfg.attention.get("window") is None,
             f"context_parallel={cp} runs the plain causal mask: set data.document_mask=false and attention.window=null")
    _require(
        world_size % cp == 0,
        f"context_parallel={cp} must divide the number of ranks ({world_size}): ranks = data-parallel × "
        f"context_parallel; launch with torchrun --nproc_per_node=<a multiple of {cp}>",
    )
    _require(
        cfg.seq_len % (2 * cp) == 0,
        f"seq_len={cfg.seq_len} must be divisible by 2 × context_parallel = {2 * cp}: each sequence is cut into "
        f"{2 * cp} equal chunks and rank r of the group keeps chunks r and {2 * cp - 1}-r (zigzag: equal causal "
        f"work on every rank); e.g. seq_len={-(-cfg.seq_len // (2 * cp)) * 2 * cp}",
    )
    _require(
        cfg.attention.name in CP_ATTENTION,
        f"attention={cfg.attention.name} cannot run with context_parallel={cp}: it needs all of a sequence's keys "
        "on one rank; use attention=flash (our ring attention) or attention=sdpa (PyTorch's context parallel)",
    )
    _require(
        cfg.attention.name != "sdpa" or resolve_device(cfg).type == "cuda",
        f"attention=sdpa with context_parallel={cp} needs CUDA: PyTorch's context parallel rings only its CUDA SDPA "
        "kernels (flash, efficient, cuDNN), not the CPU one; use attention=flash on the CPU",
    )


def resolve_device(cfg: DictConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_dtype(cfg: DictConfig, device: torch.device) -> torch.dtype:
    """Autocast dtype: bf16 on CUDA (tensor cores, no loss scaling), fp32 on CPU (bf16 is slow there)."""
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.dtype]


def resolve_compile(cfg: DictConfig, device: torch.device) -> bool:
    """auto compiles on CUDA only: on CPU it needs a C++ toolchain and costs more than it saves on tiny runs."""
    return device.type == "cuda" if cfg.compile == "auto" else bool(cfg.compile)
