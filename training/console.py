"""What a run prints: the start banner, the step line, the summary's numbers, sizes, and the
out-of-memory advice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig

from model.attention import naive_attention_bytes
from training.estimate import duration

if TYPE_CHECKING:
    from training.setup import Run


def kernel_path(cfg: DictConfig, device: torch.device) -> str:
    """Which code computes attention on this device, in words."""
    a = cfg.attention
    if a.name == "flash":
        where = f"compiled for {torch.cuda.get_device_name(device)}" if device.type == "cuda" else \
            "run by Triton's CPU interpreter (no CUDA device; slow)"
        backward = "two-pass backward" if a.get("deterministic", True) else "single-pass backward (atomic dQ, not bitwise repeatable)"
        return f"our Triton FlashAttention kernel, {where}, {backward}"
    if a.name == "sdpa":
        backend = a.get("backend", "auto")
        return "PyTorch scaled_dot_product_attention, " + ("PyTorch picks the kernel" if backend == "auto" else f"pinned to {backend}")
    return "softmax(QKᵀ)·V in PyTorch ops (the N×N scores exist)"


def start_banner(run: Run) -> list[str]:
    """The few lines a run starts with: model, attention and its kernel, device, batch, run folder.
    The full resolved config and every derived number go to the run folder, not the console."""
    cfg, d, m = run.cfg, run.derived, run.cfg.model
    position = d["params_total"] - d["params"]
    lines = [
        f"model {m.name}: {m.n_layer} layer{'s' * (m.n_layer != 1)} × {m.n_head} heads × {m.n_embd} wide, {d['params']:,} parameters "
        f"(+{position:,} position table), vocab {d['vocab_size']:,}",
        f"attention {d['attention']}: {kernel_path(cfg, run.device)}",
    ]
    batch = f"{cfg.batch_size} × {cfg.seq_len} = {d['tokens_per_step']:,} tokens per step"
    if cfg.grad_accum > 1 or d["ranks"] > 1:
        batch += f" ({d['micro_batch']} sequence{'s' * (d['micro_batch'] != 1)} per micro-step"
        if d["ranks"] > 1:
            batch += f" on each of {d['ranks']} ranks, {d['parallel']}"
        if d.get("context_parallel", 1) > 1:
            batch += f", context_parallel={d['context_parallel']}: {d['tokens_per_rank_sequence']} tokens of each per rank"
        batch += ")"
    device = f"device {d['device_name'] if run.device.type == 'cuda' else 'cpu'}, {d['dtype']}, compile {'on' if d['compile'] else 'off'}"
    if run.estimate is not None and run.estimate.total_s >= 1:  # below a second the estimate is overhead-bound noise
        device += f", ~{duration(run.estimate.total_s)} per step (estimated at start)"
    if run.peak_flops:
        device += f", MFU against {run.peak_flops / 1e12:,.0f} TFLOP/s ({d['peak_flops_source']})"
    lines += [f"{device} | {batch}"]
    resumed = f", resuming after step {run.start_step}" if run.start_step else ""
    lines.append(f"run folder {run.out_dir}{resumed} (resolved config and derived numbers: resolved_config.yaml)")
    return lines


def short(value: Any) -> str:
    """A summary value for the console: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def step_line(row: dict[str, float]) -> str:
    """`loss 3.2100 | val 3.3000 | lr 6.00e-04 | 120 ms | 8,533 tok/s | mfu 41.0% | mem 12.3 GiB`."""
    parts = [f"loss {row['train/loss']:.4f}"]
    if "val/loss" in row:
        parts.append(f"val {row['val/loss']:.4f}")
    parts += [f"lr {row['lr']:.2e}", f"{row['perf/step_ms']:.0f} ms", f"{row['perf/tokens_per_s']:,.0f} tok/s"]
    if "perf/mfu" in row:
        parts.append(f"mfu {100 * row['perf/mfu']:.1f}%")
    if "perf/peak_mem_gib" in row:
        parts.append(f"mem {row['perf/peak_mem_gib']:.1f} GiB")
    return " | ".join(parts)


def size(n_bytes: float) -> str:
    """Bytes in GiB, MiB or KiB, whichever reads best."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= scale / 2:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes / 2**10:.1f} KiB"


def oom_message(cfg: DictConfig, micro_batch: int, dtype: torch.dtype, device: torch.device,
                checkpointing: bool = False) -> str:
    """What a run that ran out of GPU memory tells its user: its shape, for naive attention the
    memory of its N×N matrices (model.attention.naive_attention_bytes), and what to change, fitted
    to the case: fewer sequences at once while there is more than one; at one sequence, what is
    still off of checkpointing and the chunked loss (with the memory each would save), then
    splitting the sequence over GPUs."""
    a, m, n = cfg.attention.name, cfg.model, cfg.seq_len
    text = f"out of GPU memory: attention={a} model={m.name} seq_len={n} batch_size={cfg.batch_size}"
    text += f" (micro-batch {micro_batch})."
    if a == "naive":
        one, kept = naive_attention_bytes(micro_batch, m.n_head, n, m.n_layer, dtype, device.type)
        text += (
            f" Naive attention makes micro-batch×heads×N×N = {micro_batch}×{m.n_head}×{n}² scores: "
            f"{size(one)} per matrix in {str(dtype).removeprefix('torch.')}, and the backward needs "
            f"{size(kept)} of them kept over {m.n_layer} layers"
        )
        if device.type == "cuda":
            text += f" (this GPU has {size(torch.cuda.get_device_properties(device).total_memory)})"
        text += "."
    advice = []
    if a != "flash":
        advice.append("attention=flash (no N×N matrices)")
    if micro_batch > 1:
        advice.append("a smaller batch_size or a larger grad_accum (the same tokens per step, fewer at once)")
    tokens, element = micro_batch * n, torch.finfo(dtype).bits // 8
    if not checkpointing:
        kept = m.n_layer * tokens * m.n_embd * (8 + 15 * element)  # training/memory.py's activation estimate
        advice.append(f"checkpointing=blocks (the blocks keep their inputs only, not ~{size(kept)} of activations; "
                      "the backward reruns each block's forward, ~1/3 more FLOPs)")
    if cfg.loss_chunk == 0:
        whole = "the tokens × vocab logits"
        if m.vocab_size:  # null: the tokenizer's, not known here
            whole = f"the {tokens}×{m.vocab_size} logits, ~{size(tokens * m.vocab_size * (element + 8))} with their float32 copy and gradient,"
        advice.append(f"loss_chunk=4096 ({whole} never built whole)")
    if micro_batch == 1:  # one sequence that does not fit: spread it (further) over GPUs
        cp = 2 * cfg.get("context_parallel", 1)
        advice.append(f"context_parallel={cp} under torchrun (each GPU holds 1/{cp} of the sequence's tokens)")
    return text + " Try " + "; or ".join(advice) + "."
