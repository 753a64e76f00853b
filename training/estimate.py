"""A start-up estimate of one optimizer step's time on a CPU, from the shape alone.

A run whose step takes minutes (GPT-2 medium through the Triton interpreter: hours) must say so
within seconds instead of looking hung, and point at what runs in a minute. Two parts, each
measured on this machine rather than assumed:

- Dense work (linear layers, lm_head, and naive/sdpa attention): the step's model FLOPs
  (model.flops.flops_per_token × tokens) over this CPU's fp32 matmul rate, timed on a 512³
  matmul (a few ms). Small models are overhead-bound, so this is a lower bound; big ones, which
  are the ones that matter here, come close to it.
- Our flash kernel in the Triton interpreter: the interpreter's cost is per program and per
  key block it visits, not per FLOP (it runs 64×64 tiles: kernels/flash_attn/launch.py). A causal
  head of N tokens has nb(nb+1)/2 (query block, key block) pairs, nb = ⌈N/64⌉, visited once by the
  forward and once by each backward pass. One head's forward + backward at N=256 (10 pairs) is
  timed once per process, after a warm-up call (the interpreter's one-time set-up, which the first
  step would pay anyway), and scaled by pairs × heads × layers × sequences: within 2× of the real
  step on the 2-core machine from N=64 to 1024.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from model.attention import get_attention
from model.flops import flops_per_token, measure_matmul_flops
from model.gpt import GPT, GPTConfig

SLOW_STEP_S = 60.0  # above this a run warns at start: "about a minute" per step is where waiting stops being fun
_BLOCK = 64  # the interpreter's tile (kernels.flash_attn.launch.kernel_config)


@dataclass
class StepEstimate:
    """Seconds per optimizer step on this process's device, split into its two parts."""

    dense_s: float  # matmuls (and naive/sdpa attention) at the measured CPU rate
    interpreter_s: float  # flash attention in the Triton interpreter (0 when not interpreting)

    @property
    def total_s(self) -> float:
        return self.dense_s + self.interpreter_s


def duration(seconds: float) -> str:
    """1.4 s, 12 min, 9.8 h: one unit that reads at a glance."""
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def causal_block_pairs(seq_len: int) -> int:
    """(query block, key block) pairs a causal head visits with 64×64 tiles."""
    nb = math.ceil(seq_len / _BLOCK)
    return nb * (nb + 1) // 2


def _model_flops_per_step(cfg: DictConfig, sequences: float) -> float:
    m = cfg.model
    vocab = m.vocab_size or cfg.data.get("vocab_size") or 50304  # the tokenizer is not trained yet: its configured size
    gcfg = GPTConfig(m.n_layer, m.n_head, m.n_embd, 64 * math.ceil(vocab / 64), cfg.seq_len, m.dropout, m.bias)
    with torch.device("meta"):  # shapes only: no memory, instant
        params = GPT(gcfg).num_params()
    return flops_per_token(gcfg, params) * sequences * cfg.seq_len


def _interpreter_s_per_pair(cfg: DictConfig, dtype: torch.dtype) -> float:
    """Seconds per (query block, key block) pair of one head's forward + backward, measured once per
    process and kernel variant (the interpreter's speed does not change within a process)."""
    options = tuple(sorted((k, v) for k, v in cfg.attention.items() if k != "name"))
    return _measure_pair_s(cfg.attention.name, options, cfg.model.n_embd // cfg.model.n_head, dtype)


@functools.lru_cache(maxsize=None)
def _measure_pair_s(name: str, options: tuple, head_dim: int, dtype: torch.dtype) -> float:
    attend = get_attention(name, **dict(options))
    timed = 0.0
    # The first call pays the interpreter's one-time set-up; the second, at 4 blocks (10 pairs), is
    # timed: long enough that the per-pair cost dominates the per-program cost, as it does at real lengths.
    for n in (_BLOCK, 4 * _BLOCK):
        q, k, v = (torch.randn(1, 1, n, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
        start = time.perf_counter()
        attend(q, k, v, True).sum().backward()
        timed = time.perf_counter() - start
    return timed / causal_block_pairs(4 * _BLOCK)


def estimate_step(cfg: DictConfig, dtype: torch.dtype, world_size: int = 1) -> StepEstimate:
    """This rank's step time on the CPU for `cfg` (batch_size resolved), measured as described above.
    The global RNG is left as it was: the run seeds it later, and a resumed run restores it."""
    with torch.random.fork_rng(devices=[]):
        return _estimate(cfg, dtype, world_size)


def _estimate(cfg: DictConfig, dtype: torch.dtype, world_size: int) -> StepEstimate:
    # This rank's share of the step's work (of whole sequences, or under context parallelism of every
    # sequence's tokens: about as much); grad_accum splits it, the work stays.
    sequences = cfg.batch_size / world_size
    rate = measure_matmul_flops(torch.device("cpu"), torch.float32, size=512, reps=3)
    dense = _model_flops_per_step(cfg, sequences) / rate
    interpreter = 0.0
    if cfg.attention.name == "flash":
        from kernels.flash_attn.launch import interpreting

        if interpreting():
            m = cfg.model
            pairs = causal_block_pairs(cfg.seq_len) * m.n_head * m.n_layer * sequences  # CP: ~pairs / cp per rank
            interpreter = pairs * _interpreter_s_per_pair(cfg, dtype)
    return StepEstimate(dense, interpreter)


def slow_step_warning(cfg: DictConfig, est: StepEstimate) -> str | None:
    """The start-up warning for a step estimated over SLOW_STEP_S, with what would be faster; None if not."""
    if est.total_s <= SLOW_STEP_S:
        return None
    text = f"one training step is estimated at ~{duration(est.total_s)} on this CPU"
    if est.interpreter_s:
        text += (f" ({duration(est.interpreter_s)} of it in our flash kernel under the Triton interpreter, which visits "
                 f"{causal_block_pairs(cfg.seq_len)} (query, key) tile pairs × {cfg.model.n_head} heads × {cfg.model.n_layer} "
                 f"layers for each of {cfg.batch_size} sequences)")
    text += ". For a first run try experiment=quickstart (a tiny model, about a minute in all)"
    if est.interpreter_s:  # sdpa does the same FLOPs without the interpreter: the dense part alone
        text += f", or attention=sdpa (~{duration(est.dense_s)} per step)"
    return text + ". Running as asked."
