"""The long-context memory frontier: which seq_len trains at batch 1 on one GPU, per attention,
with and without activation checkpointing (scripts/long_context.py is its command line).

Each point is one `python train.py experiment=long-context ...` run in a fresh process, so an
out-of-memory (or a crash) leaves nothing behind for the next point; its row is read from the run
folder's summary (training.metrics.read_summary). A point that runs out of memory is a row with
status "oom"; longer sequences of the same line are then not run (status "skipped") unless asked
to: memory only grows with seq_len. The results file is rewritten after every point, and points
already in it (ok or oom) are kept, so the sweep can be run in pieces and continued.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.results import ROOT, read_results, rounded, write_results
from bench.tables import Column, Table
from training.metrics import read_summary

ATTENTIONS = ("naive", "sdpa", "flash")
CHECKPOINTING = ("none", "blocks")
SEQ_LENS = (8192, 16384, 32768, 65536, 131072, 262144)
ROW_KEYS = ("attention", "seq_len", "checkpointing", "position", "status", "tokens_per_s", "step_ms", "peak_mem_gib",
            "attention_share", "mfu", "hfu", "estimated_gib", "loss_chunk", "final_loss", "seconds", "note", "run_dir")
KEPT_STATUS = ("ok", "oom")  # rows a continued sweep does not measure again
CONVENTION = (
    "one `train.py experiment=long-context` run per point (batch 1, bf16, compiled on CUDA), in its own process; "
    "tokens_per_s, step_ms: the trainer's median over the steps after the first that the profiler did not trace; "
    "peak_mem_gib: torch.cuda.max_memory_allocated; attention_share: GPU time of the attention operators over the wall time of "
    "3 profiled steps (profile=true; null for naive, which the compiler fuses into other kernels); mfu / hfu: model / "
    "hardware FLOPs (recompute included, model/flops.py) over the measured matmul peak; estimated_gib: "
    "training/memory.py's estimate for the point; status oom: out of memory; skipped: not run because a shorter "
    "seq_len of the same line ran out of memory; seconds: the point's wall time, compilation included"
)
TABLE = Table([
    Column("attention", "attention"), Column("checkpointing", "ckpt"), Column("position", "pos"), Column("seq_len", "seq_len"),
    Column("status", "status"), Column("tokens_per_s", "tokens/s", ".0f"), Column("step_ms", "step ms", ".0f"),
    Column("peak_mem_gib", "peak GiB", ".1f"), Column("estimated_gib", "est. GiB", ".1f"),
    Column("attention_pct", "attn %", ".0f"), Column("hfu_pct", "HFU %", ".1f"), Column("seconds", "s", ".0f"),
])


@dataclass(frozen=True)
class Point:
    attention: str
    seq_len: int
    checkpointing: str
    position: str

    @property
    def name(self) -> str:
        return f"{self.attention}-{self.checkpointing}-{self.position}-n{self.seq_len}"

    @property
    def line(self) -> tuple[str, str, str]:
        """The curve this point lies on: everything but seq_len."""
        return self.attention, self.checkpointing, self.position


def key(row: dict[str, Any]) -> tuple:
    return row["attention"], row["checkpointing"], row["position"], row["seq_len"]


def points(args: argparse.Namespace) -> list[Point]:
    """Every line × seq_len, shortest first within a line (the skip rule needs that order)."""
    return [Point(a, n, c, p) for a in args.attention for c in args.checkpointing for p in args.position
            for n in sorted(args.seq_lens)]


def train_command(point: Point, args: argparse.Namespace, run_dir: Path) -> list[str]:
    overrides = [
        "experiment=long-context", f"model={args.model}", f"attention={point.attention}", f"seq_len={point.seq_len}",
        "batch_size=1", "grad_accum=1", f"checkpointing={point.checkpointing}", f"model.position={point.position}",
        f"data={args.data}", f"steps={args.steps}", "warmup_steps=1", "eval_every=0", "eval_steps=1", "ckpt_every=0",
        "log_every=1", "logger=none", f"profile={str(args.profile).lower()}", f"hydra.run.dir={run_dir}", *args.overrides,
    ]
    return [sys.executable, str(ROOT / "train.py"), *overrides]


def point_row(point: Point, run_dir: Path, timed_out: bool = False, seconds: float | None = None) -> dict[str, Any]:
    """The row of one finished point, from its run folder (summary.json / metrics.jsonl, output.log)."""
    summary = read_summary(run_dir)[0] if run_dir.exists() else None
    note = None
    if summary is not None:
        status = summary.get("status", "error")
        if status not in ("ok", "oom"):
            note = summary.get("error")
    else:  # the process died before writing a summary: say why, from what it printed
        tail = _tail(run_dir / OUTPUT_LOG)
        status = "timeout" if timed_out else "oom" if "out of memory" in tail.lower() else "error"
        note = tail.strip().splitlines()[-1][:300] if tail.strip() else None
        summary = {}
    share = summary.get("profile/attention_share")
    row = {
        "attention": point.attention, "seq_len": point.seq_len, "checkpointing": point.checkpointing,
        "position": point.position, "status": status,
        "tokens_per_s": summary.get("final/tokens_per_s_median"), "step_ms": summary.get("final/step_ms_median"),
        "peak_mem_gib": summary.get("final/peak_mem_gib"), "attention_share": share,
        "mfu": summary.get("final/mfu_median"), "hfu": summary.get("final/hfu_median"),
        "estimated_gib": summary.get("memory/estimated_gib"), "loss_chunk": summary.get("loss_chunk"),
        "final_loss": summary.get("final/val_loss", summary.get("final/train_loss")),
        "seconds": seconds, "note": note, "run_dir": str(run_dir),
    }
    for k in ("tokens_per_s", "step_ms", "peak_mem_gib", "attention_share", "mfu", "hfu", "estimated_gib", "final_loss", "seconds"):
        row[k] = rounded(row[k], 4)
    return row


OUTPUT_LOG = "output.log"  # the point's console output (stdout and stderr), beside Hydra's train.log


def _tail(path: Path, n_bytes: int = 4000) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - n_bytes))
        return f.read().decode(errors="replace")


def run_point(point: Point, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Train one point in its own process; its row."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a re-measured point replaces its old run
    run_dir.mkdir(parents=True)
    cmd = train_command(point, args, run_dir)
    start, timed_out = time.monotonic(), False
    with open(run_dir / OUTPUT_LOG, "wb") as out:
        try:
            subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout_s, env=os.environ.copy())
        except subprocess.TimeoutExpired:  # subprocess.run has killed it
            timed_out = True
    return point_row(point, run_dir, timed_out, time.monotonic() - start)


def skipped_row(point: Point, shorter: int) -> dict[str, Any]:
    row = dict.fromkeys(ROW_KEYS)
    row.update(attention=point.attention, seq_len=point.seq_len, checkpointing=point.checkpointing, position=point.position,
               status="skipped", note=f"not run: seq_len={shorter} of this line already ran out of memory")
    return row


def sweep(args: argparse.Namespace, meta: dict[str, Any], runner: Callable[..., dict[str, Any]] = run_point,
          ) -> list[dict[str, Any]]:
    """Measure every point not already in args.out (unless --redo), writing the file after each."""
    # Every row of the file stays in it (other lines', other seq_lens'); --redo measures this command's points again.
    before = read_results(args.out) if args.out.exists() else {"meta": {}, "rows": []}
    rows = {key(r): r for r in before["rows"]}
    meta = {**meta, "commands": [*before["meta"].get("commands", []), meta.get("command")]}  # every piece of the sweep
    done = set() if args.redo else {k for k, r in rows.items() if r["status"] in KEPT_STATUS}
    if done:
        print(f"keeping {len(done)} measured point(s) from {args.out} (--redo measures them again)", flush=True)
    first_oom: dict[tuple, int] = {}
    for point in points(args):
        k = (*point.line, point.seq_len)
        if point.line in first_oom and not args.no_skip:
            rows[k] = skipped_row(point, first_oom[point.line])
        elif k not in done:
            print(f"=== {point.name}", flush=True)
            rows[k] = runner(point, args, args.runs_dir.resolve() / point.name)
            print("    " + TABLE.line(_shown(rows[k])), flush=True)
        if rows[k]["status"] == "oom":
            first_oom.setdefault(point.line, point.seq_len)
        write_results(args.out, meta, ordered(rows.values()))
    return ordered(rows.values())


def ordered(rows: Any) -> list[dict[str, Any]]:
    order = {a: i for i, a in enumerate(ATTENTIONS)}
    return sorted(rows, key=lambda r: (order.get(r["attention"], 9), r["attention"], r["checkpointing"], r["position"], r["seq_len"]))


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    pct = lambda x: None if x is None else 100 * x  # noqa: E731
    return {**row, "attention_pct": pct(row["attention_share"]), "hfu_pct": pct(row["hfu"])}


def frontier(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per line, the longest seq_len that trained, and the first that did not."""
    lines: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        f = lines.setdefault((r["attention"], r["checkpointing"], r["position"]),
                             {"attention": r["attention"], "checkpointing": r["checkpointing"], "position": r["position"],
                              "longest_ok": None, "first_oom": None})
        if r["status"] == "ok":
            f["longest_ok"] = max(f["longest_ok"] or 0, r["seq_len"])
        elif r["status"] == "oom":
            f["first_oom"] = min(f["first_oom"] or r["seq_len"], r["seq_len"])
    return list(lines.values())


def render(rows: list[dict[str, Any]]) -> str:
    return TABLE.render(map(_shown, rows))


def markdown(rows: list[dict[str, Any]]) -> str:
    return TABLE.markdown(map(_shown, rows))
