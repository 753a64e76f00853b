"""What a run prints: the step line, the summary's numbers, sizes, and the out-of-memory advice."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from model.attention import naive_attention_bytes


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


def oom_message(cfg: DictConfig, micro_batch: int, dtype: torch.dtype, device: torch.device) -> str:
    """What a run that ran out of GPU memory tells its user: its shape, for naive attention the
    memory of its N×N matrices (model.attention.naive_attention_bytes), and what to change."""
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
    if a != "flash":
        return text + " Try attention=flash (no N×N matrices), a smaller batch_size, or a larger grad_accum."
    return text + " Try a smaller batch_size or a larger grad_accum (the same tokens per step, fewer at once)."
