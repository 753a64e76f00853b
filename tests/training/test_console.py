"""training/console.py: the step line, sizes, and the out-of-memory advice."""

from types import SimpleNamespace

import torch
from conftest import compose_config

from training.console import oom_message, size, step_line


def test_step_line_shows_what_the_row_has():
    row = {"train/loss": 3.21, "lr": 6e-4, "perf/step_ms": 120.4, "perf/tokens_per_s": 8533.2}
    assert step_line(row) == "loss 3.2100 | lr 6.00e-04 | 120 ms | 8,533 tok/s"
    full = {**row, "val/loss": 3.3, "perf/mfu": 0.41, "perf/peak_mem_gib": 12.34}
    assert step_line(full) == "loss 3.2100 | val 3.3000 | lr 6.00e-04 | 120 ms | 8,533 tok/s | mfu 41.0% | mem 12.3 GiB"
    assert [size(n) for n in (2**10, 2**19, 3 * 2**30)] == ["1.0 KiB", "0.5 MiB", "3.0 GiB"]


def test_oom_message_estimates_the_naive_matrices_and_advises(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=150 * 10**9))
    cfg = compose_config("attention=naive", "model=gpt2-medium", "seq_len=8192", "batch_size=2")
    message = oom_message(cfg, 2, torch.bfloat16, torch.device("cuda"))
    assert message.startswith("out of GPU memory: attention=naive model=gpt2-medium seq_len=8192 batch_size=2 (micro-batch 2).")
    assert "2×16×8192² scores: 4.0 GiB per matrix in bfloat16" in message
    assert "the backward needs 288.0 GiB of them kept over 24 layers (this GPU has 139.7 GiB)" in message
    assert " Try attention=flash (no N×N matrices); or a smaller batch_size or a larger grad_accum (the same tokens per step, " \
        "fewer at once); or checkpointing=blocks" in message
    flash = oom_message(compose_config("attention=flash", "seq_len=8192"), 2, torch.bfloat16, torch.device("cuda"))
    assert "N×N" not in flash and "attention=flash" in flash
    assert " Try a smaller batch_size or a larger grad_accum (the same tokens per step, fewer at once); or checkpointing=blocks" in flash


def test_start_banner_says_model_attention_kernel_device_batch_and_folder():
    from pathlib import Path

    from training.console import start_banner
    from training.estimate import StepEstimate

    cfg = compose_config("model=tiny", "seq_len=64", "batch_size=8", "grad_accum=2")
    derived = {"params": 231168, "params_total": 235264, "vocab_size": 2048, "tokens_per_step": 512, "ranks": 1,
               "parallel": "none", "micro_batch": 4, "attention": "flash", "device_name": "cpu", "dtype": "float32",
               "compile": False, "peak_flops_source": "none"}
    run = SimpleNamespace(cfg=cfg, derived=derived, device=torch.device("cpu"), estimate=StepEstimate(1.0, 30.0),
                          peak_flops=None, out_dir=Path("outputs/x"), start_step=0)
    assert start_banner(run) == [
        "model tiny: 2 layers × 2 heads × 64 wide, 231,168 parameters (+4,096 position table), vocab 2,048",
        "attention flash: our Triton FlashAttention kernel, run by Triton's CPU interpreter (no CUDA device; slow), "
        "two-pass backward",
        "device cpu, float32, compile off, ~31 s per step (estimated at start) | 8 × 64 = 512 tokens per step "
        "(4 sequences per micro-step)",
        "run folder outputs/x (resolved config and derived numbers: resolved_config.yaml)",
    ]
