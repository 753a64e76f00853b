"""Compare the runs of a training sweep: one table attention × seq_len (tokens/s, step ms, peak GiB,
MFU, final loss, status), docs/results/train_sweep.json and a plot.

    python train.py -m attention=naive,sdpa,flash seq_len=1024,2048,4096,8192 steps=50
    python scripts/compare_runs.py multirun/2026-11-29/15-00-00      # that sweep's folder
    python scripts/compare_runs.py outputs multirun                    # every run below these

A run is a folder train.py wrote: metrics.jsonl (one line per step, then {"summary": ...}),
summary.json, and Hydra's .hydra/config.yaml, which says which attention, model and seq_len it
was. Status: the summary's ("ok", "oom", "nonfinite", "interrupted", "error"); "incomplete" when
metrics.jsonl has steps but no summary (killed); "error" when the run stopped before training
(config error, see its train.log). wandb offline runs inside a run folder are listed so they can be `wandb sync`ed; their
binary logs are not read (the JSONL holds the same numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable

if __package__ in (None, ""):  # `python scripts/compare_runs.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from omegaconf import OmegaConf

from scripts._common import PLOTS_DIR, RESULTS_DIR, Table, pyplot, rounded, run_meta, write_results
from training.metrics import METRICS_FILE, SUMMARY_FILE, attention_label, read_jsonl

ROW_KEYS = ("attention", "seq_len", "model", "tokens_per_s", "step_ms", "peak_mem_gib", "mfu", "final_loss", "status", "run_dir")
HYDRA_CONFIG = Path(".hydra") / "config.yaml"
CONVENTION = (
    "tokens_per_s, step_ms: the trainer's median over steps after the first (summary perf/*); peak_mem_gib: "
    "torch.cuda.max_memory_allocated; mfu: the trainer's perf/mfu (its convention is in model/flops.py); "
    "final_loss: final/val_loss, else final/train_loss. meta.gpu/torch describe the machine compare_runs ran on."
)


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Run folders at or below `paths`: those with a Hydra config or a metrics file."""
    runs = set()
    for root in paths:
        if not root.exists():
            raise SystemExit(f"{root} does not exist; pass run folders or the outputs/ or multirun/ folders above them")
        for marker in (HYDRA_CONFIG.as_posix(), METRICS_FILE):
            runs |= {p.parent.parent if marker == HYDRA_CONFIG.as_posix() else p.parent for p in root.rglob(marker)}
    return sorted(runs)


def read_summary(run: Path) -> tuple[dict[str, Any] | None, int]:
    """(the run's summary or None, number of logged steps)."""
    steps, summary = 0, None
    if (run / METRICS_FILE).exists():
        for record in read_jsonl(run / METRICS_FILE):  # skips a line torn by a killed run
            if "summary" in record:
                summary = record["summary"]
            else:
                steps += 1
    if summary is None and (run / SUMMARY_FILE).exists():
        summary = json.loads((run / SUMMARY_FILE).read_text())
    return summary, steps


def run_row(run: Path) -> dict[str, Any] | None:
    """One table row for a run folder, or None (with a note) when it is not a training run."""
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
    final = summary.get("final/val_loss", summary.get("final/train_loss"))
    row = {
        "attention": attention_label(cfg), "seq_len": int(cfg.seq_len), "model": str(cfg.model.name),
        "tokens_per_s": summary.get("perf/tokens_per_s"), "step_ms": summary.get("perf/step_ms"),
        "peak_mem_gib": summary.get("perf/peak_mem_gib"), "mfu": summary.get("perf/mfu"),
        "final_loss": final, "status": status, "run_dir": str(run),
    }
    for key in ("tokens_per_s", "step_ms", "peak_mem_gib", "mfu", "final_loss"):
        row[key] = rounded(row[key])
    return row


def collect(paths: Iterable[Path]) -> list[dict[str, Any]]:
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
    preferred = ["naive", "sdpa", "flash"]
    present = {r["attention"] for r in rows}
    return [a for a in preferred if a in present] + sorted(present - set(preferred))


def pivot(rows: list[dict[str, Any]]) -> str:
    """tokens/s as seq_len rows × attention columns (status where there is no number)."""
    attns = attention_order(rows)
    lines = []
    for model in sorted({r["model"] for r in rows}):
        cells = {(r["seq_len"], r["attention"]): r for r in rows if r["model"] == model}
        lines.append(f"tokens/s, {model}: " + "".join(f"{a:>14}" for a in attns))
        for n in sorted({n for n, _ in cells}):
            out = []
            for a in attns:
                r = cells.get((n, a))
                out.append("" if r is None else f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] is not None and r["status"] == "ok" else r["status"])
            lines.append(f"{'seq_len ' + str(n):>{len('tokens/s, ' + model + ': ')}}" + "".join(f"{c:>14}" for c in out))
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """tokens/s and peak memory vs seq_len, one line per attention; an x on the axis marks OOM."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    models = sorted({r["model"] for r in rows})
    lines = [(m, a) for m in models for a in attention_order(rows)]
    for i, (model, attn) in enumerate(lines):
        mine = sorted((r for r in rows if (r["model"], r["attention"]) == (model, attn)), key=lambda r: r["seq_len"])
        color, attn = f"C{i % 10}", attn if len(models) == 1 else f"{attn} ({model})"
        for ax, key in zip(axes, ("tokens_per_s", "peak_mem_gib")):
            ok = [(r["seq_len"], r[key]) for r in mine if r["status"] == "ok" and r[key] is not None]
            if ok:
                ax.plot(*zip(*ok), marker="o", color=color, label=attn)
            ooms = [r["seq_len"] for r in mine if r["status"] == "oom"]
            if ooms:
                ax.plot(ooms, [0] * len(ooms), "x", ms=10, mew=2, color=color, label=f"{attn}: out of memory", clip_on=False)
    seqlens = sorted({r["seq_len"] for r in rows})
    for ax, label in zip(axes, ("tokens / s", "peak memory (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens, [str(n) for n in seqlens])
        ax.set_xlabel("seq_len")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"training sweep: {', '.join(models)}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TABLE = Table([
    ("model", "model", 12, ""), ("seq_len", "seq_len", 7, ""), ("attention", "attention", 12, ""),
    ("tokens_per_s", "tokens/s", 10, ".0f"), ("step_ms", "step ms", 9, ".1f"), ("peak_mem_gib", "peak GiB", 8, ".1f"),
    ("mfu_pct", "MFU %", 6, ".1f"), ("final_loss", "loss", 7, ".3f"), ("status", "status", 10, ""),
])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, help="run folders, or folders above them (a -m sweep folder, outputs/, multirun/)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "train_sweep.json")
    p.add_argument("--plot", type=Path, default=PLOTS_DIR / "train_sweep.png")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    rows = collect(args.paths)
    if not rows:
        raise SystemExit(f"no training runs found under {', '.join(map(str, args.paths))}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = run_meta(device, CONVENTION, sweep_paths=[str(p) for p in args.paths])
    print(TABLE.render({**r, "mfu_pct": None if r["mfu"] is None else 100 * r["mfu"]} for r in rows))
    print("\n" + pivot(rows))
    offline = sorted(str(d) for r in rows for d in Path(r["run_dir"]).glob("wandb/offline-run-*"))
    if offline:
        print(f"\n{len(offline)} wandb offline runs; publish with: wandb sync {' '.join(offline[:3])}{' ...' if len(offline) > 3 else ''}")
    write_results(args.out, meta, rows)
    print(f"\nwrote {args.out}", flush=True)
    if not args.no_plot:
        print(f"wrote {plot(rows, args.plot)}", flush=True)
    return rows


if __name__ == "__main__":
    main()
