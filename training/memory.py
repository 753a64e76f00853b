"""How much GPU memory a training step needs, estimated from the shape; and `checkpointing=auto`.

The estimate (bytes on one device, one micro-batch), for eager PyTorch under autocast with
element size e (2 for bf16, 4 for fp32). torch.compile's partitioner recomputes cheap
elementwise ops instead of saving them, so compiled runs need less: the estimate errs high.
- states: float32 weights, gradients and the two AdamW moments (16 bytes per parameter), plus
  autocast's copy of each weight (e bytes); FSDP divides them by the ranks.
- activations kept for the backward, per token and layer: the float32 residual stream at both
  LayerNorm inputs (8·C), and in the autocast dtype the inputs of qkv (C), q, k, v (3C), the
  attention output and the copy the projection reads (2C), the MLP input (C), fc's output (4C) and
  GELU's output (4C): 8·C + 15·e·C. Rope adds the rotated q and k (2·e·C); naive attention its
  kept N×N probabilities (model.attention.naive_attention_bytes). With checkpointing the blocks
  keep their float32 inputs only (4·C per layer) and one block is rebuilt at a time.
- logits: tokens × V × (e + 4 + 4) (the logits, their float32 copy, its gradient); a chunked loss
  holds `loss_chunk` tokens' worth.
Under context parallelism a rank holds seq_len / cp tokens of each sequence (its N×N-free
attention's ring buffers are not counted).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from model.attention import naive_attention_bytes
from model.gpt import GPT, GPTConfig
from training.distributed import DistInfo

log = logging.getLogger(__name__)

FIT = 0.9  # auto turns checkpointing on above this share of the free memory: room for the allocator's fragmentation


@dataclass(frozen=True)
class StepMemory:
    """Estimated bytes of one training step, by what holds them."""

    states: float  # weights, gradients, AdamW moments, autocast weight copies
    activations: float  # what the blocks keep for the backward
    logits: float  # the loss's logits, float32 copy and gradient

    @property
    def total(self) -> float:
        return self.states + self.activations + self.logits


@functools.lru_cache(maxsize=16)
def _param_count(cfg: GPTConfig) -> int:
    with torch.device("meta"):  # shapes only: counts parameters without allocating them
        return GPT(cfg).num_params(non_embedding=False)


def estimate_step_memory(
    cfg: GPTConfig, micro_batch: int, attention: str, dtype: torch.dtype,
    checkpointing: bool, loss_chunk: int, shards: int = 1, context_parallel: int = 1,
) -> StepMemory:
    """The module docstring's estimate for `micro_batch` sequences of cfg.seq_len tokens (seq_len /
    context_parallel of each on this rank), the weights' state split over `shards` (FSDP)."""
    e = torch.finfo(dtype).bits // 8
    C, L, tokens = cfg.n_embd, cfg.n_layer, micro_batch * cfg.seq_len // context_parallel
    n_params = _param_count(cfg)
    states = n_params * (16 + (e if e < 4 else 0)) / shards
    per_layer = 8 * C + 15 * e * C + (2 * e * C if cfg.position == "rope" else 0)  # per token
    naive_kept = 0
    if attention == "naive":
        naive_kept = naive_attention_bytes(micro_batch, cfg.n_head, cfg.seq_len, 1, dtype)[1]  # one layer's
    if checkpointing:
        activations = L * 4 * C * tokens + per_layer * tokens + naive_kept
    else:
        activations = L * (per_layer * tokens + naive_kept)
    logit_tokens = min(tokens, loss_chunk) if loss_chunk > 0 else tokens
    return StepMemory(states, activations, logit_tokens * cfg.vocab_size * (e + 8))


def rank_estimate(cfg: DictConfig, model_cfg: GPTConfig, dtype: torch.dtype, checkpointing: bool,
                  dist: DistInfo = DistInfo()) -> StepMemory:
    """The estimate for this rank of a run: its micro-batch, its share of each sequence, its shard of the weights."""
    micro_batch = cfg.batch_size // (cfg.grad_accum * dist.dp_size)
    shards = dist.world_size if dist.launched and cfg.parallel == "fsdp" else 1
    return estimate_step_memory(model_cfg, micro_batch, cfg.attention.name, dtype, checkpointing, cfg.loss_chunk,
                                shards, dist.cp)


def resolve_checkpointing(cfg: DictConfig, model_cfg: GPTConfig, device: torch.device, dtype: torch.dtype,
                          dist: DistInfo = DistInfo()) -> tuple[bool, str]:
    """(checkpointing on?, why) for cfg.checkpointing: none, blocks, or auto, which turns it on only
    when a step without it is estimated not to fit the GPU's free memory (on the CPU: off)."""
    if cfg.checkpointing != "auto":
        on = cfg.checkpointing == "blocks"
        return on, f"checkpointing={cfg.checkpointing}: activation checkpointing {'on' if on else 'off'}"
    if device.type != "cuda":
        return False, "checkpointing=auto: off (on the CPU there is no GPU memory to run out of)"
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device)  # what this process already holds is its to reuse
    need = rank_estimate(cfg, model_cfg, dtype, False, dist)
    on = need.total > FIT * free
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    return on, (
        f"checkpointing=auto: {'on' if on else 'off'}: a step without it needs ~{gib(need.total)} (weights, grads, "
        f"AdamW {gib(need.states)}; activations {gib(need.activations)}; logits {gib(need.logits)}), "
        f"{'over' if on else 'within'} {FIT:.0%} of the {gib(free)} free on {device}"
    )
