"""Multi-GPU scaling of train.py: the same per-GPU batch on 1, 2, 4, ... GPUs, DDP or FSDP2.

Two steps, so runs can be spread over GPUs and machines and reported together:

    # each RUN is attention:gpus[:parallel]; 1 GPU is a plain `python train.py`, more go through torchrun
    python scripts/scaling.py run flash:1 sdpa:1 flash:2 sdpa:2 flash:2:fsdp --runs-dir scaling_runs
    python scripts/scaling.py run flash:2 --train data=synthetic compile=false   # the rest goes to train.py
    python scripts/scaling.py report scaling_runs            # table + outputs/bench/<date>/scaling/scaling.json
    python scripts/scaling.py report scaling_runs --out docs/results/scaling.json   # update the committed results

`--train` (or a bare `--`) ends scaling.py's own arguments: everything after it is passed to every
train.py unchanged. Runs go to outputs/bench/<date>/scaling/runs/<name> unless --runs-dir says.

Defaults: GPT-2 medium, seq_len 8192, 2 sequences per GPU per step (batch_size = 2 × GPUs), bf16
and compiled (train.py's CUDA defaults), 40 steps, no evaluation or checkpoints in between.
Scaling efficiency = tokens/s on n GPUs ÷ (n × tokens/s of the same attention on one GPU).
Per-GPU peak memory is the fullest rank's torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from bench import runs as train_runs
from bench.results import ROOT, default_out, output_dir, rounded, run_meta, write_json, write_results
from bench.runs import NCCL_SAFE_ENV
from bench.tables import Column, Table
from training.distributed import PARALLEL
from training.metrics import HYDRA_CONFIG, find_runs, read_summary

SCRIPT = "scaling"
ROW_KEYS = ("attention", "parallel", "gpus", "seq_len", "per_gpu_batch", "tokens_per_s", "tokens_per_s_per_gpu",
            "step_ms", "peak_mem_gib", "mfu", "scaling_efficiency", "final_loss", "status", "run_dir")
CONVENTION = (
    "tokens_per_s: all GPUs' tokens per second, the trainer's median over steps after the first; step_ms: the "
    "slowest rank's median step; peak_mem_gib: the fullest GPU's torch.cuda.max_memory_allocated; "
    "scaling_efficiency: tokens_per_s / (gpus × the same attention's 1-GPU tokens_per_s); 1 GPU runs are a "
    "plain `python train.py` (no process group), more GPUs go through torchrun with NCCL."
)
LAUNCH_FILE = "launch.json"


@dataclass(frozen=True)
class RunSpec:
    attention: str
    gpus: int
    parallel: str = "ddp"

    @property
    def name(self) -> str:
        return f"{self.attention}-1gpu" if self.gpus == 1 else f"{self.attention}-{self.parallel}-{self.gpus}gpu"

    @classmethod
    def parse(cls, text: str) -> "RunSpec":
        parts = text.split(":")
        if not 2 <= len(parts) <= 3 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: write a run as attention:gpus[:parallel], e.g. flash:2:fsdp")
        parallel = parts[2] if len(parts) == 3 else "ddp"
        if parallel not in PARALLEL:
            raise argparse.ArgumentTypeError(f"{text!r}: parallel must be one of {', '.join(PARALLEL)}")
        return cls(parts[0], int(parts[1]), parallel)


def command(spec: RunSpec, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The command line of one run: train.py's overrides are the same on any number of GPUs
    except batch_size, which keeps the per-GPU batch fixed (weak scaling)."""
    overrides = [
        f"attention={spec.attention}", f"model={args.model}", f"seq_len={args.seq_len}",
        f"batch_size={args.per_gpu_batch * spec.gpus}", "grad_accum=1", f"parallel={spec.parallel}",
        f"steps={args.steps}", f"warmup_steps={min(5, args.steps)}", "eval_every=0", "eval_steps=2",
        "ckpt_every=0", "log_every=10", "logger=none", f"hydra.run.dir={run_dir}", *args.overrides,
    ]
    if spec.gpus == 1:
        launcher = [sys.executable, str(ROOT / "train.py")]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec.gpus}",
                    str(ROOT / "train.py")]
    return launcher + overrides


def run_all(args: argparse.Namespace) -> int:
    available = torch.cuda.device_count()
    on_cpu = "device=cpu" in args.overrides  # ranks as CPU processes (gloo): a smoke test of the launch
    for spec in args.runs:
        if spec.gpus > available and not on_cpu and not args.dry_run:
            raise SystemExit(f"{spec.name}: {spec.gpus} GPUs asked for, this machine has {available}; drop the run, "
                             "use a machine with more GPUs, or add `--train device=cpu` to run the ranks on the CPU")
    failed = 0
    for spec in args.runs:
        run_dir = args.runs_dir.resolve() / spec.name
        cmd = command(spec, args, run_dir)
        print(f"\n=== {spec.name}: {' '.join(cmd)}", flush=True)
        if args.dry_run:
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a re-run replaces the old one: report reads one run per name
        run_dir.mkdir(parents=True)
        # What was launched, for the report: a run that dies before its summary still says its GPU count.
        write_json(run_dir / LAUNCH_FILE, {"gpus": spec.gpus, "parallel": spec.parallel, "command": cmd})
        start = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **NCCL_SAFE_ENV}).returncode
        print(f"=== {spec.name}: exit {rc} after {time.monotonic() - start:.0f} s", flush=True)
        failed += rc != 0
    print(f"\nruns in {args.runs_dir}; report with: python scripts/scaling.py report {args.runs_dir}", flush=True)
    return 1 if failed else 0


def run_row(run: Path) -> dict[str, Any] | None:
    """One row per run folder: compare_runs' row (speed, memory, loss, status) plus the GPU count,
    parallelism and per-GPU batch; scaling efficiency is filled in later from the 1-GPU rows."""
    base = train_runs.run_row(run)
    if base is None:
        return None
    cfg = OmegaConf.load(run / HYDRA_CONFIG)
    summary = read_summary(run)[0] or {}
    # A run that ended before its summary has no rank count: the launch record says how many were meant.
    launched = json.loads((run / LAUNCH_FILE).read_text()) if (run / LAUNCH_FILE).exists() else {}
    gpus = int(summary.get("ranks") or launched.get("gpus") or 1)
    tps = summary.get("final/tokens_per_s_median")  # unrounded: the row's own value is rounded to 5 digits
    row = {**base, "parallel": str(cfg.parallel) if gpus > 1 else "single", "gpus": gpus,
           "per_gpu_batch": int(cfg.batch_size) // gpus, "tokens_per_s_per_gpu": rounded(tps / gpus if tps else None),
           "scaling_efficiency": None}
    return {key: row[key] for key in ROW_KEYS}


def with_efficiency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill scaling_efficiency against the 1-GPU run of the same attention, seq_len and per-GPU batch."""
    single = {(r["attention"], r["seq_len"], r["per_gpu_batch"]): r["tokens_per_s"]
              for r in rows if r["gpus"] == 1 and r["status"] == "ok" and r["tokens_per_s"]}
    for r in rows:
        base = single.get((r["attention"], r["seq_len"], r["per_gpu_batch"]))
        if base and r["status"] == "ok" and r["tokens_per_s"]:
            r["scaling_efficiency"] = rounded(r["tokens_per_s"] / (r["gpus"] * base), 4)
    return rows


TABLE = Table([
    Column("attention", "attention"), Column("parallel", "parallel"), Column("gpus", "GPUs"),
    Column("seq_len", "seq_len"), Column("per_gpu_batch", "batch/GPU"), Column("tokens_per_s", "tokens/s", ".0f"),
    Column("tokens_per_s_per_gpu", "tok/s/GPU", ".0f"), Column("step_ms", "step ms", ".1f"),
    Column("peak_mem_gib", "GiB/GPU", ".1f"), Column("mfu_pct", "MFU %", ".1f"), Column("efficiency_pct", "scaling %", ".1f"),
    Column("status", "status"),
])


def report(args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        runs = find_runs(args.runs_dirs)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    rows = [r for r in map(run_row, runs) if r is not None]
    if not rows:
        raise SystemExit(f"no training runs under {', '.join(map(str, args.runs_dirs))}; run `scaling.py run ...` first")
    rows = with_efficiency(sorted(rows, key=lambda r: (r["seq_len"], r["attention"], r["gpus"], r["parallel"])))
    shown = [{**r, "mfu_pct": r["mfu"] and 100 * r["mfu"],
              "efficiency_pct": r["scaling_efficiency"] and 100 * r["scaling_efficiency"]} for r in rows]
    print(TABLE.render(shown))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = run_meta(device, CONVENTION, gpus_on_machine=torch.cuda.device_count(),
                    runs_dirs=[str(p) for p in args.runs_dirs])
    write_results(args.out, meta, rows, markdown=TABLE.markdown(shown))
    print(f"\nwrote {args.out}", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="launch the runs, one after another")
    r.add_argument("runs", nargs="+", type=RunSpec.parse, help="attention:gpus[:parallel], e.g. flash:1 flash:2:fsdp")
    r.add_argument("--runs-dir", type=Path, help=f"default {output_dir(SCRIPT) / 'runs'}")
    r.add_argument("--model", default="gpt2-medium")
    r.add_argument("--seq-len", type=int, default=8192)
    r.add_argument("--per-gpu-batch", type=int, default=2, help="sequences per GPU per step")
    r.add_argument("--steps", type=int, default=40)
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    r.add_argument("--train", dest="overrides", nargs=argparse.REMAINDER, default=[], metavar="KEY=VALUE",
                   help="the rest of the command line goes to train.py unchanged (e.g. --train device=cpu compile=false)")
    q = sub.add_parser("report", help="table and JSON of the runs below the given folders")
    q.add_argument("runs_dirs", nargs="+", type=Path)
    q.add_argument("--out", type=Path, help=f"default {default_out(SCRIPT, 'scaling.json')}")
    argv = list(sys.argv[1:] if argv is None else argv)
    # A bare `--` (the spelling train.py users know) means --train: argparse would hand it to the greedy RUN list.
    if "--" in argv:
        argv[argv.index("--")] = "--train"
    args = p.parse_args(argv)
    if args.what == "run":
        args.runs_dir = args.runs_dir or output_dir(SCRIPT) / "runs"
    else:
        args.out = args.out or default_out(SCRIPT, "scaling.json")
    return args


def main(argv: list[str] | None = None) -> Any:
    args = parse_args(argv)
    return run_all(args) if args.what == "run" else report(args)


if __name__ == "__main__":
    out = main()
    sys.exit(out if isinstance(out, int) else 0)
