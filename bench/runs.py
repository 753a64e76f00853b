"""Rows of training-run folders (what train.py leaves: .hydra/config.yaml, metrics.jsonl,
summary.json) for compare_runs.py and scaling.py; the folders are read by training.metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench.results import rounded
from training.metrics import HYDRA_CONFIG, attention_label, find_runs, read_summary

# NVLink multicast stays off for the GPU runs the scripts launch (the device docs: it can take a
# shared host's GPUs down); torchrun's children inherit the environment, so setting it covers every rank.
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ROW_KEYS = ("attention", "seq_len", "model", "tokens_per_s", "step_ms", "peak_mem_gib", "mfu", "final_loss", "status", "run_dir")
CONVENTION = (
    "tokens_per_s, step_ms: the trainer's median over steps after the first (summary perf/*); peak_mem_gib: "
    "torch.cuda.max_memory_allocated; mfu: the trainer's perf/mfu (its convention is in model/flops.py); "
    "final_loss: final/val_loss, else final/train_loss. meta.gpu/torch describe the machine compare_runs ran on."
)


def run_row(run: Path) -> dict[str, Any] | None:
    """One table row for a run folder, or None (with a note) when it is not a training run.
    Status: the summary's ("ok", "oom", "nonfinite", "interrupted", "error"); "incomplete" when
    metrics.jsonl has steps but no summary (killed); "error" when the run stopped before training."""
    if not (run / HYDRA_CONFIG).exists():
        print(f"  skipping {run}: no {HYDRA_CONFIG} (not a run written by train.py)", flush=True)
        return None
    cfg = OmegaConf.load(run / HYDRA_CONFIG)
    summary, steps = read_summary(run)
    if summary is None:
        status = "incomplete" if steps else "error"
        summary = {}
    else:
        status = summary.get("status", "ok")
    row = {
        "attention": attention_label(cfg), "seq_len": int(cfg.seq_len), "model": str(cfg.model.name),
        "tokens_per_s": summary.get("perf/tokens_per_s"), "step_ms": summary.get("perf/step_ms"),
        "peak_mem_gib": summary.get("perf/peak_mem_gib"), "mfu": summary.get("perf/mfu"),
        "final_loss": summary.get("final/val_loss", summary.get("final/train_loss")), "status": status, "run_dir": str(run),
    }
    for key in ("tokens_per_s", "step_ms", "peak_mem_gib", "mfu", "final_loss"):
        row[key] = rounded(row[key])
    return row


def collect(paths: list[Path]) -> list[dict[str, Any]]:
    """Rows of every run, sorted by model, seq_len, attention; of repeated configurations the
    most recently finished run is kept (a re-run after a fix replaces the failed one)."""
    newest: dict[tuple, tuple[float, dict[str, Any]]] = {}
    for run in find_runs(paths):
        row = run_row(run)
        if row is None:
            continue
        key = (row["model"], row["seq_len"], row["attention"])
        mtime = max((p.stat().st_mtime for p in run.iterdir()), default=0.0)
        if key in newest:
            print(f"  {key}: keeping the newer of {newest[key][1]['run_dir']} and {run}", flush=True)
        if key not in newest or mtime >= newest[key][0]:
            newest[key] = (mtime, row)
    return [row for _, (_, row) in sorted(newest.items())]


def attention_order(rows: list[dict[str, Any]]) -> list[str]:
    """naive, sdpa, flash first (the README's order), then the others alphabetically."""
    preferred = ["naive", "sdpa", "flash"]
    present = {r["attention"] for r in rows}
    return [a for a in preferred if a in present] + sorted(present - set(preferred))
