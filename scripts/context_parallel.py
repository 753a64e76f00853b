"""Context parallelism on GPUs: GPT-2 medium at long context on one GPU (cp=1) and split over two
or more (cp=2, 4, 8), per attention: tokens/s per GPU, peak memory per GPU, the longest seq_len that
trains, and the share of the ring's communication hidden behind compute (profiler trace of steps 3-5).

    python scripts/context_parallel.py                                  # flash and sdpa, the seq_len ladder
    python scripts/context_parallel.py --attention flash --seq-lens 32768 65536 131072 262144
    python scripts/context_parallel.py --out docs/results/context_parallel.json   # update the committed results
    python scripts/context_parallel.py --dry-run                        # the commands only
    python scripts/context_parallel.py --report-only --runs-dir <runs>  # rows from runs already made
    python scripts/context_parallel.py --cp 1 2 4 8 --seq-lens 131072 262144 524288 1048576   # 8 GPUs
    python scripts/context_parallel.py --dp 2 --cp 2 --seq-lens 131072 262144   # data parallel × context parallel: 4 GPUs

Each run is train.py with --experiment (default long-context: GPT-2 medium with rotary positions, the chunked
loss and checkpointing=auto, as the one-GPU frontier of scripts/long_context.py; bf16, compiled), one sequence
per data-parallel replica (batch_size = dp), synthetic tokens (speed only), profile=true; dp × cp > 1
goes through torchrun on dp × cp GPUs with context_parallel=cp. For each attention, dp and cp the
ladder climbs until a run fails (OOM): the last that trained is the frontier. Everything after
--train goes to every train.py unchanged.

efficiency (dp × cp GPUs at seq_len S) = its tokens/s per GPU ÷ one GPU's tokens/s at S/cp, i.e. at
the same tokens per GPU. Attention per GPU then grows cp× (causal pairs grow with S²), so 1.0 is
not the ceiling of a perfect ring; the frontier (memory) is what CP is for.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from bench.comm_overlap import ring_overlap
from bench.results import ROOT, default_out, output_dir, rounded, run_meta, write_results
from bench.runs import NCCL_SAFE_ENV, run_row
from bench.tables import Column, Table
from training.metrics import HYDRA_CONFIG, read_summary
from training.profiling import ACTIVE_STEPS, TRACE_FILE

SCRIPT = "context_parallel"
ROW_KEYS = ("attention", "gpus", "dp", "cp", "seq_len", "status", "tokens_per_s", "tokens_per_s_per_gpu", "peak_mem_gib",
            "efficiency", "step_ms", "ring_comm_ms", "ring_exposed_ms", "comm_hidden_share", "run_dir")
CONVENTION = (
    "tokens_per_s: all GPUs' tokens per second, the trainer's median over the steps after the first that the profiler did not trace; tokens_per_s_per_gpu = "
    "tokens_per_s / gpus (gpus = dp × cp); peak_mem_gib: the fullest GPU's torch.cuda.max_memory_allocated; efficiency: "
    "tokens/s per GPU at seq_len S / one GPU's tokens/s at S/cp (the same tokens per GPU); ring_comm_ms: rank 0's NCCL kernel "
    "time per step other than AllReduce/ReduceScatter (DDP), ring_exposed_ms: the part with no compute kernel beside "
    "it, comm_hidden_share = 1 - exposed/comm (an NCCL kernel's time includes waiting for its peer); frontier: the "
    "longest seq_len with status ok per attention and layout, the ladder stopping at the first failure. batch_size=dp "
    "(one sequence per data-parallel replica), bf16, compiled, "
    "each run's recipe in its .hydra/overrides.yaml (default experiment=long-context: GPT-2 medium, rope, chunked loss, "
    "checkpointing=auto per rank), "
    "data=synthetic, profile=true (steps 3-5 traced)."
)
SEQ_LENS = [16384, 32768, 65536, 131072, 262144, 524288]
TABLE = Table([
    Column("attention", "attention"), Column("gpus", "GPUs"), Column("dp", "dp"), Column("cp", "cp"), Column("seq_len", "seq_len"), Column("status", "status"),
    Column("tokens_per_s_per_gpu", "tok/s/GPU", ".0f"), Column("peak_mem_gib", "GiB/GPU", ".1f"),
    Column("efficiency", "efficiency", ".3f"), Column("ring_comm_ms", "ring ms/step", ".1f"),
    Column("comm_hidden_share", "hidden", ".2f"),
])


def run_name(attention: str, dp: int, cp: int, seq_len: int) -> str:
    return f"{attention}-cp{cp}-n{seq_len}" if dp == 1 else f"{attention}-dp{dp}-cp{cp}-n{seq_len}"


def command(attention: str, dp: int, cp: int, seq_len: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    overrides = [
        f"experiment={args.experiment}", f"attention={attention}", f"seq_len={seq_len}", f"batch_size={dp}", "grad_accum=1",
        f"context_parallel={cp}", "data=synthetic", f"data.num_tokens={max(4 * seq_len, 2**22)}", f"steps={args.steps}",
        "warmup_steps=2", "eval_every=0", "eval_steps=1", "ckpt_every=0", "logger=none", "profile=true",
        f"hydra.run.dir={run_dir}", *args.overrides,
    ]
    if dp * cp == 1:
        return [sys.executable, str(ROOT / "train.py"), *overrides]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={dp * cp}",
            str(ROOT / "train.py"), *overrides]


def run_ladders(args: argparse.Namespace) -> None:
    gpus = max(args.dp) * max(args.cp)
    if torch.cuda.device_count() < gpus and not args.dry_run:
        raise SystemExit(f"dp {max(args.dp)} × cp {max(args.cp)} needs {gpus} GPUs; this machine has "
                         f"{torch.cuda.device_count()}: pass smaller --dp / --cp")
    for attention in args.attention:
        for dp, cp in ((dp, cp) for dp in args.dp for cp in args.cp):
            for seq_len in args.seq_lens:
                run_dir = args.runs_dir.resolve() / run_name(attention, dp, cp, seq_len)
                cmd = command(attention, dp, cp, seq_len, args, run_dir)
                print(f"\n=== {run_dir.name}: {' '.join(cmd)}", flush=True)
                if args.dry_run:
                    continue
                if run_dir.exists():
                    shutil.rmtree(run_dir)  # a re-run replaces the old one
                run_dir.mkdir(parents=True)
                start = time.monotonic()
                rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **NCCL_SAFE_ENV}).returncode
                print(f"=== {run_dir.name}: exit {rc} after {time.monotonic() - start:.0f} s", flush=True)
                if rc != 0:  # OOM (exit 1) or worse: longer sequences would fail too
                    print(f"=== {attention} dp={dp} cp={cp}: the ladder stops at seq_len {seq_len}", flush=True)
                    break


def row_of(run: Path) -> dict[str, Any] | None:
    base = run_row(run)
    if base is None:
        return None
    cfg = OmegaConf.load(run / HYDRA_CONFIG)
    cp = int(cfg.context_parallel)
    # the ranks the run had, as scaling.py counts them; a run that ended before its summary has no
    # count: then what command() launched, one sequence (batch_size = dp) per data-parallel replica
    gpus = int((read_summary(run)[0] or {}).get("ranks") or int(cfg.batch_size) * cp)
    tps = base["tokens_per_s"]
    trace = run / TRACE_FILE
    comm = ring_overlap(json.loads(trace.read_text()), ACTIVE_STEPS) if trace.exists() else {}
    row = {**base, "gpus": gpus, "dp": gpus // cp, "cp": cp, "efficiency": None,
           "tokens_per_s_per_gpu": rounded(tps / gpus if tps else None),
           **{key: rounded(comm.get(key), 4) for key in ("ring_comm_ms", "ring_exposed_ms", "comm_hidden_share")}}
    return {key: row.get(key) for key in ROW_KEYS}


def with_efficiency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """efficiency of each multi-GPU row against the one-GPU row with the same tokens per GPU."""
    one = {(r["attention"], r["seq_len"]): r["tokens_per_s"] for r in rows if r["gpus"] == 1 and r["status"] == "ok"}
    for r in rows:
        base = one.get((r["attention"], r["seq_len"] // r["cp"]))
        if r["gpus"] > 1 and r["status"] == "ok" and base and r["tokens_per_s_per_gpu"]:
            r["efficiency"] = rounded(r["tokens_per_s_per_gpu"] / base, 4)
    return rows


def frontier(rows: list[dict[str, Any]]) -> dict[str, dict[str, int | None]]:
    """The longest seq_len that trained, per attention and layout ("cp2", or "dp2xcp2" with data parallelism)."""
    out: dict[str, dict[str, int | None]] = {}
    for r in rows:
        layout = f"cp{r['cp']}" if r["dp"] == 1 else f"dp{r['dp']}xcp{r['cp']}"
        best = out.setdefault(r["attention"], {}).setdefault(layout, None)
        if r["status"] == "ok" and (best is None or r["seq_len"] > best):
            out[r["attention"]][layout] = r["seq_len"]
    return out


def report(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = sorted(p for p in args.runs_dir.glob("*-cp*-n*") if p.is_dir())
    rows = [r for r in map(row_of, runs) if r is not None]
    if not rows:
        raise SystemExit(f"no runs under {args.runs_dir}; run without --report-only first")
    rows = with_efficiency(sorted(rows, key=lambda r: (r["attention"], r["gpus"], r["dp"], r["seq_len"])))
    print(TABLE.render(rows))
    reach = frontier(rows)
    print("\nlongest seq_len that trains:", json.dumps(reach))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = run_meta(device, CONVENTION, gpus_on_machine=torch.cuda.device_count(), runs_dir=str(args.runs_dir))
    write_results(args.out, meta, rows, frontier=reach, markdown=TABLE.markdown(rows))
    print(f"\nwrote {args.out}", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", nargs="+", default=["flash", "sdpa"], choices=["flash", "sdpa"])
    p.add_argument("--cp", nargs="+", type=int, default=[1, 2], help="context-parallel degrees")
    p.add_argument("--dp", nargs="+", type=int, default=[1],
                   help="data-parallel degrees; each run takes dp × cp GPUs and one sequence per replica")
    p.add_argument("--seq-lens", nargs="+", type=int, default=SEQ_LENS, help="the ladder, climbed until a run fails")
    p.add_argument("--steps", type=int, default=12, help="steps per run; tokens/s is the median after the first")
    p.add_argument("--experiment", default="long-context", help="train.py's recipe (configs/experiment/)")
    p.add_argument("--runs-dir", type=Path, help=f"default {output_dir(SCRIPT) / 'runs'}")
    p.add_argument("--out", type=Path, help=f"default {default_out(SCRIPT, 'context_parallel.json')}")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--report-only", action="store_true", help="no runs: the rows of those in --runs-dir")
    p.add_argument("--train", dest="overrides", nargs=argparse.REMAINDER, default=[], metavar="KEY=VALUE",
                   help="the rest of the command line goes to every train.py unchanged")
    args = p.parse_args(argv)
    args.runs_dir = args.runs_dir or output_dir(SCRIPT) / "runs"
    args.out = args.out or default_out(SCRIPT, "context_parallel.json")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]] | None:
    args = parse_args(argv)
    if not args.report_only:
        run_ladders(args)
    return None if args.dry_run else report(args)


if __name__ == "__main__":
    main()
