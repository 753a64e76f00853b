"""The recomputation, made visible: per-kernel GPU time of our backward (preprocess, dK/dV, dQ) next
to our forward, from torch.profiler, and the backward/forward time ratio of ours and of naive
attention over seqlen.

    python scripts/profile_backward.py                       # seqlen 1k..16k, bf16, d=64, causal and not
    python scripts/profile_backward.py --seqlens 8192 --causal true
    python scripts/profile_backward.py --device cpu --quick   # smoke run (no kernel times on CPU)
    python scripts/profile_backward.py --impls flash flash_fused --seqlens 8192   # the two backward schedules
    python scripts/profile_backward.py --out docs/results/backward_profile.json  # update the committed results

What to expect from FLOPs alone: our backward recomputes S = QKᵀ (and P) from the saved
log-sum-exp, 10·d·pairs against the forward's 4·d·pairs, a ratio of 2.5; naive keeps P and does
8·d·pairs, 2.0. The measured ratios show what the recompute costs in time.

Writes outputs/bench/<date>/profile_backward/backward_profile.json ({"meta", "rows"}) and a
markdown table beside it (.md).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import torch

from bench.cli import CAUSAL_CHOICES, fill_defaults, resolve_device
from bench.failures import run_guarded
from bench.impls import make_impl
from bench.inputs import Shape, step_fns
from bench.results import default_out, rounded, run_meta, write_results, write_text
from bench.sweep import Point, bench_point
from bench.tables import Column, Table
from bench.timing import synchronize
from kernels.flops import attention_flops

SCRIPT = "profile_backward"
KERNEL_CLASSES = ("fwd", "preprocess", "dkdv", "dq", "bwd_other", "other")
BWD_CLASSES = ("preprocess", "dkdv", "dq", "bwd_other")
FLOP_PASSES = {"flash": "bwd", "flash_two_pass": "bwd", "flash_fused": "bwd", "naive": "bwd_stored_p"}  # which backward each implementation runs
DEFAULT_IMPLS = ["flash", "naive"]

CONVENTION = (
    "fwd_ms, bwd_ms: medians from triton.testing.do_bench as in bench_attention (bwd = fwd+bwd - fwd). "
    "kernel_ms: GPU time per forward+backward of each of our kernels, summed from torch.profiler device "
    "events over --iters iterations after warm-up, classified by kernel name (_fwd -> fwd, preprocess, "
    "dkdv, dq, other _bwd (flash_fused's single-pass _bwd_fused_kernel) -> bwd_other, anything else, e.g. fills and "
    "flash_fused's dQ zeroing and cast -> other). flop_ratio: backward/forward "
    "FLOPs of the algorithm (2.5 recomputing, 2.0 keeping P)."
)


def classify_kernel(name: str) -> str:
    """Which part of our attention a GPU kernel belongs to, from its name (see KERNEL_CLASSES)."""
    n = name.lower()
    if "preprocess" in n:
        return "preprocess"
    if "dkdv" in n or "dk_dv" in n:
        return "dkdv"
    if "_dq" in n or n.startswith("dq"):
        return "dq"
    if "_bwd" in n:  # e.g. a fused _attn_bwd kernel
        return "bwd_other"
    if "_fwd" in n:
        return "fwd"
    return "other"


def kernel_ms_per_iter(events: Iterable[tuple[str, float]], iters: int) -> dict[str, float]:
    """Sum (kernel name, microseconds) events by class and divide by the iteration count -> ms."""
    totals: dict[str, float] = defaultdict(float)
    for name, us in events:
        totals[classify_kernel(name)] += us
    return {cls: totals[cls] / 1e3 / iters for cls in KERNEL_CLASSES}


def profile_kernels(point: Point, device: torch.device, iters: int) -> dict[str, float] | None:
    """Per-class kernel ms of our forward+backward at `point`, or None where the profiler sees no
    GPU kernels (CPU)."""
    shape = Shape(point.batch, point.heads, point.seqlen, point.head_dim, point.dtype, point.causal)
    q, k, v, do = shape.inputs(device)
    _, forward_backward = step_fns(make_impl(point.impl), q, k, v, do, point.causal)
    for _ in range(3):  # compile and autotune outside the profile
        forward_backward()
    synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            forward_backward()
        synchronize(device)
    gpu = torch.autograd.DeviceType.CUDA
    events = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == gpu]
    return kernel_ms_per_iter(events, iters) if events else None


def measure(point: Point, device: torch.device, iters: int, warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    attn = run_guarded(lambda: make_impl(point.impl), device, f"{point.impl} (building)")[0]
    timed = bench_point(point, attn, device, warmup_ms, rep_ms)
    fwd, bwd = (attention_flops(point.batch, point.heads, point.seqlen, point.seqlen, point.head_dim, point.causal, p)
                for p in ("fwd", FLOP_PASSES[point.impl]))
    row = {**{k: timed[k] for k in ("impl", "dtype", "head_dim", "seqlen", "batch", "heads", "causal", "fwd_ms", "bwd_ms")},
           "bwd_fwd_ratio": None, "flop_ratio": bwd / fwd, "kernel_ms": None, "kernel_bwd_fwd_ratio": None, "status": timed["status"]}
    if timed["fwd_ms"] and timed["bwd_ms"] is not None:
        row["bwd_fwd_ratio"] = rounded(timed["bwd_ms"] / timed["fwd_ms"], 4)
    if point.impl in ("flash", "flash_two_pass", "flash_fused") and row["status"] == "ok":
        kernels, status = run_guarded(lambda: profile_kernels(point, device, iters), device, f"profile {point.impl} N={point.seqlen}")
        row["status"] = status
        if kernels is not None:
            row["kernel_ms"] = {cls: rounded(ms) for cls, ms in kernels.items()}
            if kernels["fwd"] > 0:
                row["kernel_bwd_fwd_ratio"] = rounded(sum(kernels[c] for c in BWD_CLASSES) / kernels["fwd"], 4)
    return row


TABLE = Table([
    Column("impl", "impl"), Column("seqlen", "N"), Column("batch", "B"), Column("causal", "causal"),
    Column("fwd_ms", "fwd ms", ".3f"), Column("bwd_ms", "bwd ms", ".3f"), Column("bwd_fwd_ratio", "bwd/fwd", ".2f"),
    Column("flop_ratio", "FLOPs", ".1f"), Column("k_fwd", "k fwd", ".3f"), Column("k_preprocess", "k pre", ".3f"),
    Column("k_dkdv", "k dkdv", ".3f"), Column("k_dq", "k dq", ".3f"), Column("k_bwd_other", "k fused", ".3f"),
    Column("k_other", "k other", ".3f"), Column("kernel_bwd_fwd_ratio", "k bwd/fwd", ".2f"), Column("status", "status"),
])


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its kernel times as top-level k_* cells, for the tables."""
    kernels = row["kernel_ms"] or {}
    return {**row, **{f"k_{c}": kernels.get(c) for c in KERNEL_CLASSES}}


DEFAULTS = dict(seqlens=[1024, 2048, 4096, 8192, 16384], tokens=16384, heads=16, head_dim=64, iters=5, warmup_ms=25.0, rep_ms=50.0)
QUICK = dict(seqlens=[64], tokens=64, heads=2, head_dim=16, iters=1, warmup_ms=1.0, rep_ms=5.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--seqlens", nargs="+", type=int, help=f"default {d['seqlens']}")
    p.add_argument("--tokens", type=int, help=f"batch × seqlen held fixed (default {d['tokens']})")
    p.add_argument("--heads", type=int, help=f"default {d['heads']}")
    p.add_argument("--head-dim", type=int, help=f"default {d['head_dim']}")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--causal", choices=CAUSAL_CHOICES, default="both")
    p.add_argument("--impls", nargs="+", choices=tuple(FLOP_PASSES), default=DEFAULT_IMPLS)
    p.add_argument("--iters", type=int, help=f"profiled forward+backward iterations (default {d['iters']})")
    p.add_argument("--device", help="cuda (default when present) or cpu")
    p.add_argument("--warmup-ms", type=float)
    p.add_argument("--rep-ms", type=float)
    p.add_argument("--quick", action="store_true", help=f"CPU smoke run: {QUICK}; explicit flags still win")
    p.add_argument("--out", type=Path, help=f"result JSON, the markdown goes beside it (.md) (default {default_out(SCRIPT, 'backward_profile.json')})")
    args = p.parse_args(argv)
    args.out = args.out or default_out(SCRIPT, "backward_profile.json")
    return fill_defaults(p, args, DEFAULTS, QUICK, dtype_keys=["dtype"])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    meta = run_meta(device, CONVENTION)
    print(f"backward profile on {meta['gpu']}: {args.dtype}, d={args.head_dim}, {args.heads} heads, {args.tokens} tokens", flush=True)
    rows = []
    for causal in CAUSAL_CHOICES[args.causal]:
        for impl in args.impls:
            for n in sorted(args.seqlens):
                point = Point(impl, args.dtype, args.head_dim, n, max(1, args.tokens // n), args.heads, causal)
                rows.append(measure(point, device, args.iters, args.warmup_ms, args.rep_ms))
                print(TABLE.line(flat(rows[-1])), flush=True)
                write_results(args.out, meta, rows)
    print("\n" + TABLE.render(flat(r) for r in rows), flush=True)
    if device.type != "cuda":
        print("(no kernel times: torch.profiler records GPU kernels only on CUDA)", flush=True)
    md = args.out.with_suffix(".md")
    write_text(md, f"## Backward vs forward ({meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']})\n\n"
                   f"{args.dtype}, head_dim {args.head_dim}, {args.heads} heads, batch × seqlen = {args.tokens}. "
                   f"Times in ms; k_* = our kernels per forward+backward (torch.profiler).\n\n"
                   f"{TABLE.markdown(flat(r) for r in rows)}\n\n{CONVENTION}\n")
    print(f"wrote {args.out} and {md}", flush=True)
    return rows


if __name__ == "__main__":
    main()
