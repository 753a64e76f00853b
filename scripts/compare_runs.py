"""Compare the runs of a training sweep: one table attention × seq_len (tokens/s, step ms, peak GiB,
MFU, final loss, status), a results JSON and a plot (speed and memory vs seq_len, loss vs tokens).

    python train.py -m attention=naive,sdpa,flash seq_len=1024,2048,4096,8192 steps=50
    python scripts/compare_runs.py multirun/2026-11-29/15-00-00      # that sweep's folder
    python scripts/compare_runs.py outputs multirun                    # every run below these
    python scripts/compare_runs.py multirun/... --out docs/results/train_sweep.json --plot docs/train_sweep.png

A run is a folder train.py wrote: metrics.jsonl (one line per step, then {"summary": ...}),
summary.json, and Hydra's .hydra/config.yaml, which says which attention, model and seq_len it
was (read by training.metrics.find_runs / read_summary). Status: the summary's ("ok", "oom",
"nonfinite", "stopped", "interrupted", "error"); "incomplete" when metrics.jsonl has steps but no
summary (killed); "error" when the run stopped before training (config error, see its train.log).
Several runs of one (model, seq_len, attention): the finished one is shown, the newest among
equals; one line says how many were set aside, `--all` lists them. wandb offline runs inside a run
folder are listed so they can be `wandb sync`ed; their binary logs are not read (the JSONL holds
the same numbers).

Writes outputs/bench/<date>/compare_runs/train_sweep.json and train_sweep.png (docs/ only with --out).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate

from bench.plots import plot_train_sweep
from bench.results import default_out, run_meta, write_results
from bench.runs import CONVENTION, attention_order, collect, set_aside_line
from bench.tables import Column, Table

SCRIPT = "compare_runs"

TABLE = Table([
    Column("model", "model"), Column("seq_len", "seq_len"), Column("attention", "attention"),
    Column("tokens_per_s", "tokens/s", ".0f"), Column("step_ms", "step ms", ".1f"), Column("peak_mem_gib", "peak GiB", ".1f"),
    Column("mfu_pct", "MFU %", ".1f"), Column("final_loss", "loss", ".3f"), Column("status", "status"),
])


SET_ASIDE = Table([*TABLE.columns, Column("run_dir", "run folder")])


def _shown(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "mfu_pct": None if r["mfu"] is None else 100 * r["mfu"]} for r in rows]


def pivot(rows: list[dict[str, Any]]) -> str:
    """tokens/s as seq_len rows × attention columns, one table per model (status where there is no number)."""
    attns = attention_order(rows)
    tables = []
    for model in sorted({r["model"] for r in rows}):
        cells = {(r["seq_len"], r["attention"]): r for r in rows if r["model"] == model}
        body = []
        for n in sorted({n for n, _ in cells}):
            line = [f"seq_len {n}"]
            for a in attns:
                r = cells.get((n, a))
                ok = r is not None and r["tokens_per_s"] is not None and r["status"] == "ok"
                line.append("" if r is None else f"{r['tokens_per_s']:,.0f}" if ok else r["status"])
            body.append(line)
        tables.append(tabulate(body, headers=[f"tokens/s, {model}", *attns], disable_numparse=True, stralign="right"))
    return "\n\n".join(tables)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, help="run folders, or folders above them (a -m sweep folder, outputs/, multirun/)")
    p.add_argument("--out", type=Path, help=f"result JSON (default {default_out(SCRIPT, 'train_sweep.json')})")
    p.add_argument("--plot", type=Path, help="the plot (default: train_sweep.png beside --out)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--all", action="store_true", help="also list the runs set aside (repeats of a configuration shown)")
    args = p.parse_args(argv)
    args.out = args.out or default_out(SCRIPT, "train_sweep.json")
    args.plot = args.plot or args.out.with_name("train_sweep.png")
    try:
        rows, aside = collect(args.paths)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    if not rows:
        raise SystemExit(f"no training runs found under {', '.join(map(str, args.paths))}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = run_meta(device, CONVENTION, sweep_paths=[str(p) for p in args.paths])
    print(TABLE.render(_shown(rows)))
    print("\n" + pivot(rows))
    if aside:
        print("\n" + set_aside_line(aside))
        if args.all:
            print(SET_ASIDE.render(_shown(aside)))
    offline = sorted(str(d) for r in rows for d in Path(r["run_dir"]).glob("wandb/offline-run-*"))
    if offline:
        print(f"\n{len(offline)} wandb offline runs; publish with: wandb sync {' '.join(offline[:3])}{' ...' if len(offline) > 3 else ''}")
    write_results(args.out, meta, rows, set_aside=aside)
    print(f"\nwrote {args.out}", flush=True)
    if not args.no_plot:
        print(f"wrote {plot_train_sweep(rows, args.plot)}", flush=True)
    return rows


if __name__ == "__main__":
    main()
