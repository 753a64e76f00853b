"""Model FLOPs per token and MFU, written once for train.py, scripts and tests.

Convention (stated wherever an MFU is reported):
- Dense part: 6·P FLOPs per token, P = parameters without the position table (a lookup, not a
  matmul); the tied token embedding counts once, as lm_head. 2·P forward (one multiply-add per
  weight) + 4·P backward (gradients w.r.t. activations and weights).
- Attention part, per layer, from kernels.flops.attention_flops: forward 4·d·pairs plus a
  backward that keeps P, 8·d·pairs ("bwd_stored_p"), i.e. the FLOPs the model needs, not the
  extra 2·d·pairs FlashAttention spends recomputing QKᵀ. pairs are causal: N(N+1)/2 per head.
"""

from __future__ import annotations

import time

import torch

from kernels.flops import attention_flops
from model.gpt import GPTConfig

MFU_CONVENTION = (
    "6*params(no position table) + attention fwd 4*d*pairs + bwd 8*d*pairs (no recompute), "
    "causal pairs N(N+1)/2"
)


def flops_per_token(cfg: GPTConfig, n_params: int) -> float:
    """Training FLOPs (forward + backward) per token of a seq_len-long causal sequence."""
    n = cfg.seq_len
    attn_per_seq = sum(
        attention_flops(1, cfg.n_head, n, n, cfg.head_dim, causal=True, pass_=p)
        for p in ("fwd", "bwd_stored_p")
    )
    return 6.0 * n_params + cfg.n_layer * attn_per_seq / n


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the accelerator's peak FLOP/s."""
    return tokens_per_s * flops_per_tok / peak_flops


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, size: int = 4096, reps: int = 10) -> float:
    """Achieved FLOP/s of a square matmul: a measured stand-in when no peak is configured.

    Median of timed repeats after a warm-up; MFU against it reads higher than against a
    datasheet peak (matmuls never reach the datasheet), so logs name which one was used.
    """
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = []
    for i in range(reps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:  # the first calls pay for kernel selection and caches
            times.append(time.perf_counter() - t0)
    return 2.0 * size**3 / sorted(times)[len(times) // 2]
