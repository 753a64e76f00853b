"""Model FLOPs per token and MFU, written once for train.py, scripts and tests.

Convention (stated wherever an MFU is reported):
- Dense part: 6·P FLOPs per token, P = parameters without the position table (a lookup, not a
  matmul); the tied token embedding counts once, as lm_head. 2·P forward (one multiply-add per
  weight) + 4·P backward (gradients w.r.t. activations and weights).
- Attention part, per layer, from kernels.flops.attention_flops: forward 4·d·pairs plus a
  backward that keeps P, 8·d·pairs ("bwd_stored_p"), i.e. the FLOPs the model needs, not the
  extra 2·d·pairs FlashAttention spends recomputing QKᵀ. pairs are causal: N(N+1)/2 per head,
  or those of the causal sliding window (attention.window). Document masks change the pairs with
  every batch; the per-token figure leaves them out, so under data.document_mask it is an upper
  bound of the FLOPs the model needs (FlopCounterMode counts a batch's real pairs).

MFU counts those model FLOPs; HFU (hardware FLOPs utilisation, as in Korthikanti et al. 2022)
adds what the hardware runs again to save memory (recompute_flops_per_token): the attention
backward's QKᵀ (flash, and SDPA's GPU kernels), each checkpointed block's forward, and a chunked
loss's lm_head. HFU ≥ MFU; the gap is the price of the memory saved.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from kernels.flops import attention_flops
from model.attention import AttendFn
from model.gpt import GPT, GPTConfig

MFU_CONVENTION = (
    "6*params(no position table) + attention fwd 4*d*pairs + bwd 8*d*pairs (no recompute), "
    "causal pairs N(N+1)/2"
)
HFU_CONVENTION = (
    "MFU's FLOPs + recompute: attention bwd 2*d*pairs (flash, sdpa), checkpointed blocks' forward up to the "
    "MLP's output matmul (qkv, attn proj, fc: 16*C^2 per token, + attention fwd), chunked loss 2*V*C per token"
)


def flops_per_token(cfg: GPTConfig, n_params: int, window_size: tuple[int, int] = (-1, -1)) -> float:
    """Training FLOPs (forward + backward) per token of a seq_len-long causal sequence
    (window_size: flash-attn's (left, right) of a sliding window, model.attention.window_size)."""
    n = cfg.seq_len
    attn_per_seq = sum(
        attention_flops(1, cfg.n_head, n, n, cfg.head_dim, causal=True, pass_=p, window_size=window_size)
        for p in ("fwd", "bwd_stored_p")
    )
    return 6.0 * n_params + cfg.n_layer * attn_per_seq / n


def recompute_flops_per_token(
    cfg: GPTConfig, attention: str, checkpointing: bool, loss_chunk: int, window_size: tuple[int, int] = (-1, -1)
) -> dict[str, float]:
    """FLOPs per token the hardware runs beyond flops_per_token, by cause (0 where it does not apply).

    attention_bwd: FlashAttention-style backwards (ours, and SDPA's cuDNN / flash / efficient
      kernels) rebuild QKᵀ: 2·d·pairs per head and layer. Naive keeps P: nothing.
    blocks: a checkpointed block's backward first reruns its forward, as far as it must to rebuild
      what the backward reads; the last matmul (the MLP's output projection) only saved its input,
      so it is not rerun (torch.utils.checkpoint stops early): qkv + attention projection + fc,
      2·(3 + 1 + 4)·C² per token, plus the attention forward, per layer.
    lm_head: a chunked loss rebuilds each chunk's logits: 2·V·C per token.
    """
    n, C, L = cfg.seq_len, cfg.n_embd, cfg.n_layer
    per_layer = {p: attention_flops(1, cfg.n_head, n, n, cfg.head_dim, True, p, window_size=window_size) / n
                 for p in ("fwd", "bwd", "bwd_stored_p")}
    return {
        "attention_bwd": L * (per_layer["bwd"] - per_layer["bwd_stored_p"]) if attention != "naive" else 0.0,
        "blocks": L * (2 * 8 * C * C + per_layer["fwd"]) if checkpointing else 0.0,
        "lm_head": 2.0 * cfg.vocab_size * C if loss_chunk > 0 else 0.0,
    }


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the accelerator's peak FLOP/s.
    With hardware FLOPs per token (flops_per_token + recompute) the same ratio is the HFU."""
    return tokens_per_s * flops_per_tok / peak_flops


# Dense 16-bit tensor-core peaks (bf16 / fp16, no sparsity) from NVIDIA's datasheets, by a
# substring of torch.cuda.get_device_name; the first match wins (NVL / PCIe before the SXM names).
DATASHEET_TFLOPS_16BIT = (
    ("H200 NVL", 835.0), ("H200", 989.4),
    ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4),
    ("A100", 312.0), ("L40S", 362.05),
)


def datasheet_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense peak FLOP/s of this GPU at a 16-bit dtype, or None (unknown GPU, or
    float32, whose tensor-core rate depends on the TF32 setting)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    return next((tflops * 1e12 for key, tflops in DATASHEET_TFLOPS_16BIT if key in device_name), None)


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


# ops whose FLOPs belong to attention proper (QKᵀ, PV and their gradients); dense layers run as mm/addmm
_ATTENTION_OP_PREFIXES = ("flashgpt.", "aten._scaled_dot_product", "aten.scaled_dot_product", "aten.bmm")


def _split_counts(counter: FlopCounterMode) -> tuple[int, int]:
    """(dense, attention) FLOPs from a FlopCounterMode's global per-op counts."""
    dense = attention = 0
    for op, flops in counter.get_flop_counts()["Global"].items():
        if str(op).startswith(_ATTENTION_OP_PREFIXES):
            attention += flops
        else:
            dense += flops
    return dense, attention


def count_step_flops(
    model_cfg: GPTConfig, attend: AttendFn, batch_size: int, checkpointing: bool = False, loss_chunk: int = 0
) -> dict[str, float]:
    """FLOPs of one training micro-step, executed (counted by FlopCounterMode) and algorithmic.

    The model is built on the meta device (shapes only: no memory, no compute, so this also
    works for a naive N×N run that would not fit) and run forward, then backward, each under
    its own counter. Keys (per micro-step of `batch_size` sequences):
      flops/model_fwd, flops/model_bwd               dense layers (linear + lm_head), counted; with
                                                     checkpointing / loss_chunk the backward includes
                                                     the rerun forward matmuls (and attn_bwd_executed
                                                     the rerun attention forward)
      flops/attn_fwd_executed, flops/attn_bwd_executed
                                                     attention as the implementation runs it, counted
                                                     by the ops' formulas: naive multiplies the full
                                                     N×N square (mask applied afterwards); torch's SDPA
                                                     formula counts the square too (its fused backends
                                                     skip masked blocks, so this overstates them); flash
                                                     counts its visible pairs, backward recompute included
      flops/attn_fwd_algorithmic, ..._bwd_algorithmic
                                                     what causal attention needs, the same for every
                                                     attention (the MFU convention): 4·d·pairs forward,
                                                     8·d·pairs for a backward that keeps P
      flops/attn_recompute                           executed backward beyond a stored-P backward of the
                                                     same forward (2·d·pairs per head for flash; 0 naive;
                                                     plus the rerun forward under checkpointing)
      flops/attn_recompute_share                     that, as a share of the whole step's executed FLOPs
    """
    with torch.device("meta"):
        model = GPT(model_cfg, attend)
    model.set_checkpointing(checkpointing)
    model.loss_chunk = loss_chunk
    idx = torch.zeros(batch_size, model_cfg.seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as fwd:
        _, loss = model(idx, idx)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    model_fwd, attn_fwd = _split_counts(fwd)
    model_bwd, attn_bwd = _split_counts(bwd)
    n, h, d = model_cfg.seq_len, model_cfg.n_head, model_cfg.head_dim
    per_layer = {p: attention_flops(batch_size, h, n, n, d, True, p) for p in ("fwd", "bwd_stored_p")}
    recompute = max(0, attn_bwd - 2 * attn_fwd)  # a stored-P backward costs exactly 2× its forward
    total = model_fwd + model_bwd + attn_fwd + attn_bwd
    return {
        "flops/model_fwd": model_fwd, "flops/model_bwd": model_bwd,
        "flops/attn_fwd_executed": attn_fwd, "flops/attn_bwd_executed": attn_bwd,
        "flops/attn_fwd_algorithmic": model_cfg.n_layer * per_layer["fwd"],
        "flops/attn_bwd_algorithmic": model_cfg.n_layer * per_layer["bwd_stored_p"],
        "flops/attn_recompute": recompute,
        "flops/attn_recompute_share": recompute / total if total else 0.0,
    }
