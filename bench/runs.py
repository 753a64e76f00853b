"""Rows of training-run folders (what train.py leaves: .hydra/config.yaml, metrics.jsonl,
summary.json) for compare_runs.py and scaling.py; the folders are read by training.metrics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench.results import rounded
from training.metrics import HYDRA_CONFIG, METRICS_FILE, TOKENS, attention_label, find_runs, read_jsonl, read_summary

# NVLink multicast stays off for the GPU runs the scripts launch (the device docs: it can take a
# shared host's GPUs down); torchrun's children inherit the environment, so setting it covers every rank.
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ROW_KEYS = ("attention", "seq_len", "model", "tokens_per_s", "step_ms", "peak_mem_gib", "mfu", "final_loss", "status", "run_dir")
CONVENTION = (
    "tokens_per_s, step_ms: the trainer's median over steps after the first (summary final/*_median); peak_mem_gib: "
    "torch.cuda.max_memory_allocated; mfu: the trainer's final/mfu_median (its convention is in model/flops.py); "
    "final_loss: final/val_loss, else final/train_loss. meta.gpu/torch describe the machine compare_runs ran on."
)
# Of several runs of one (model, seq_len, attention) the best status is shown, the newest among equals:
# a run that trained to the end, then one that ran into OOM/NaN (a real outcome), then a stopped one.
STATUS_RANK = {"ok": 0, "oom": 1, "nonfinite": 1, "stopped": 2, "interrupted": 2, "incomplete": 3, "error": 4}
ATTENTION_ORDER = ("naive", "sdpa", "flash")  # the README's order; variants (sdpa_cudnn, flash_two_pass) follow their base


def run_row(run: Path) -> dict[str, Any] | None:
    """One table row for a run folder, or None (with a note) when it is not a training run.
    Status: the summary's ("ok", "oom", "nonfinite", "stopped", "interrupted", "error"); "incomplete"
    when metrics.jsonl has steps but no summary (killed); "error" when the run stopped before training."""
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
        "tokens_per_s": summary.get("final/tokens_per_s_median"), "step_ms": summary.get("final/step_ms_median"),
        "peak_mem_gib": summary.get("final/peak_mem_gib"), "mfu": summary.get("final/mfu_median"),
        "final_loss": summary.get("final/val_loss", summary.get("final/train_loss")), "status": status, "run_dir": str(run),
    }
    for key in ("tokens_per_s", "step_ms", "peak_mem_gib", "mfu", "final_loss"):
        row[key] = rounded(row[key])
    return row


def attention_rank(label: str) -> tuple[int, str]:
    """Sort key: naive, sdpa (then its pinned backends), flash (then flash_two_pass), then others by name."""
    base = label.split("_")[0]
    return (ATTENTION_ORDER.index(base) if base in ATTENTION_ORDER else len(ATTENTION_ORDER), label)


def attention_order(rows: list[dict[str, Any]]) -> list[str]:
    """The attentions present in `rows`, in the order every table and plot uses (attention_rank)."""
    return sorted({r["attention"] for r in rows}, key=attention_rank)


def row_order(row: dict[str, Any]) -> tuple:
    return (row["model"], row["seq_len"], attention_rank(row["attention"]))


def collect(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows shown, rows set aside): one row per (model, seq_len, attention), sorted by those (attention
    in attention_rank's order). Of repeated configurations the best status wins (STATUS_RANK: a finished
    run over a stopped, killed or failed one), the most recent among equals; the others are set aside."""
    best: dict[tuple, tuple[tuple, dict[str, Any]]] = {}
    aside = []
    for run in find_runs(paths):
        row = run_row(run)
        if row is None:
            continue
        key = (row["model"], row["seq_len"], row["attention"])
        mtime = max((p.stat().st_mtime for p in run.iterdir()), default=0.0)
        preference = (-STATUS_RANK.get(row["status"], len(STATUS_RANK)), mtime)
        if key in best and best[key][0] >= preference:
            aside.append(row)
            continue
        if key in best:
            aside.append(best[key][1])
        best[key] = (preference, row)
    return sorted((row for _, row in best.values()), key=row_order), sorted(aside, key=row_order)


def set_aside_line(aside: list[dict[str, Any]]) -> str:
    """One line for the runs collect() set aside: how many, by status."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(Counter(r["status"] for r in aside).items()))
    return (f"set aside {len(aside)} repeated run(s) of a configuration shown above ({counts}): a finished run "
            "is shown over an unfinished one, the newest among equals; --all lists them")


def loss_curve(run: Path) -> dict[str, list[tuple[float, float]]]:
    """{"train": [(tokens, loss), ...], "val": [...]} from a run's metrics.jsonl. Tokens are the rows'
    train/tokens, or step × batch_size × seq_len for runs logged before that key existed."""
    curves: dict[str, list[tuple[float, float]]] = {"train": [], "val": []}
    if not (run / METRICS_FILE).exists():
        return curves
    cfg = OmegaConf.load(run / HYDRA_CONFIG)
    batch = cfg.get("batch_size") or (cfg.get("tokens_per_step") or 0) // cfg.seq_len  # null: from tokens_per_step
    for record in read_jsonl(run / METRICS_FILE):
        tokens = record.get(TOKENS, record.get("step", 0) * batch * cfg.seq_len)
        for split in curves:
            if f"{split}/loss" in record:
                curves[split].append((tokens, record[f"{split}/loss"]))
    return curves
