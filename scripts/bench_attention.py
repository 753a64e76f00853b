"""Attention sweep: forward, backward and forward+backward time, TFLOP/s and extra peak memory of
every attention implementation over seqlen × causal × head_dim × dtype.

    python scripts/bench_attention.py                           # full default sweep (H200: a few minutes)
    python scripts/bench_attention.py --impls flash sdpa --seqlens 4096 8192 --dtypes bf16 --causal true
    python scripts/bench_attention.py --impls flash flash_fused sdpa --seqlens 8192 --dtypes bf16   # our two backwards
    python scripts/bench_attention.py --dtypes fp16 --append    # add points to an existing JSON
    python scripts/bench_attention.py --device cpu --quick      # smoke run without a GPU
    python scripts/bench_attention.py --out docs/results/attention_bench.json --plot-dir docs   # update the committed results

Writes outputs/bench/<date>/bench_attention/attention_bench.json ({"meta", "rows"}; rewritten
after every point, so an interrupted sweep keeps what it measured) and three plots beside it.
Batch × seqlen is held at --tokens (batch = max(1, tokens // seqlen)). A point that runs out of
memory is recorded with status "oom", one an implementation cannot run with "unsupported", and
the sweep goes on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.cli import CAUSAL_CHOICES, fill_defaults, resolve_device
from bench.impls import IMPL_NAMES, default_impls
from bench.plots import plot_attention_sweep
from bench.results import default_out, read_results, run_meta, write_results
from bench.sweep import CONVENTION, build_impls, merge_rows, run_sweep, sweep_points
from bench.tables import Column, Table

SCRIPT = "bench_attention"
DEFAULTS = dict(seqlens=[512, 1024, 2048, 4096, 8192, 16384, 32768], tokens=16384, heads=16, head_dims=[64, 128],
                dtypes=["bfloat16", "float16"], warmup_ms=25.0, rep_ms=50.0)
QUICK = dict(seqlens=[32, 64], tokens=64, heads=2, head_dims=[16], dtypes=["bfloat16"], warmup_ms=1.0, rep_ms=5.0)

TABLE = Table([
    Column("impl", "impl"), Column("dtype", "dtype"), Column("head_dim", "d"), Column("seqlen", "N"),
    Column("batch", "B"), Column("causal", "causal"), Column("fwd_ms", "fwd ms", ".3f"), Column("bwd_ms", "bwd ms", ".3f"),
    Column("fwdbwd_ms", "f+b ms", ".3f"), Column("fwd_tflops", "fwd TF/s", ".1f"), Column("bwd_tflops", "bwd TF/s", ".1f"),
    Column("fwdbwd_tflops", "f+b TF/s", ".1f"), Column("peak_mem_mib", "mem MiB", ".0f"), Column("status", "status"),
])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", nargs="+", choices=IMPL_NAMES, help="default: all (flex left out on CPU)")
    d = DEFAULTS
    p.add_argument("--seqlens", nargs="+", type=int, help=f"default: {d['seqlens']}")
    p.add_argument("--head-dims", nargs="+", type=int, help=f"default: {d['head_dims']}")
    p.add_argument("--dtypes", nargs="+", help=f"bfloat16/bf16, float16/fp16 (default: {d['dtypes']})")
    p.add_argument("--causal", choices=CAUSAL_CHOICES, default="both")
    p.add_argument("--tokens", type=int, help=f"batch × seqlen held fixed (default {d['tokens']})")
    p.add_argument("--heads", type=int, help=f"default {d['heads']}")
    p.add_argument("--device", help="cuda (default when present) or cpu")
    p.add_argument("--warmup-ms", type=float, help=f"do_bench warm-up budget per measurement (default {d['warmup_ms']})")
    p.add_argument("--rep-ms", type=float, help=f"do_bench repetition budget per measurement (default {d['rep_ms']})")
    p.add_argument("--quick", action="store_true", help=f"CPU smoke run: {QUICK}; explicit flags still win")
    p.add_argument("--out", type=Path, help=f"result JSON (default {default_out(SCRIPT, 'attention_bench.json')})")
    p.add_argument("--plot-dir", type=Path, help="where the three plots go (default: beside --out)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--append", action="store_true", help="merge into --out: keep its rows that this run does not re-measure")
    args = p.parse_args(argv)
    args.out = args.out or default_out(SCRIPT, "attention_bench.json")
    args.plot_dir = args.plot_dir or args.out.parent
    return fill_defaults(p, args, DEFAULTS, QUICK, dtype_keys=["dtypes"])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    impl_names = args.impls or default_impls(device)
    points = sweep_points(impl_names, args.dtypes, args.head_dims, CAUSAL_CHOICES[args.causal], args.seqlens, args.tokens, args.heads)
    meta = run_meta(device, CONVENTION)
    old_rows: list[dict[str, Any]] = []
    if args.append and args.out.exists():
        previous = read_results(args.out)
        old_rows = previous["rows"]
        meta["previous_meta"] = {k: v for k, v in previous["meta"].items() if k != "previous_meta"}
    print(f"{len(points)} points on {meta['gpu']} (torch {meta['torch']}, triton {meta['triton']}); "
          f"impls: {' '.join(impl_names)}; writing {args.out}", flush=True)
    print(f"convention: {CONVENTION}", flush=True)
    impls = build_impls(impl_names, device)
    new_rows: list[dict[str, Any]] = []
    start = last = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        nonlocal last
        new_rows.append(row)
        now = time.perf_counter()
        print(f"[{len(new_rows)}/{len(points)}] {TABLE.line(row)}  ({now - last:.1f} s)", flush=True)  # wall time per point, to budget sweeps
        last = now
        write_results(args.out, meta, merge_rows(old_rows, new_rows))

    run_sweep(points, impls, device, args.warmup_ms, args.rep_ms, on_row)
    rows = merge_rows(old_rows, new_rows)
    write_results(args.out, meta, rows)
    print("\n" + TABLE.render(rows), flush=True)
    print(f"wrote {args.out} ({len(rows)} rows) after {time.perf_counter() - start:.0f} s", flush=True)
    if not args.no_plots and rows:
        for path in plot_attention_sweep(rows, args.plot_dir):
            print(f"wrote {path}", flush=True)
    return rows


if __name__ == "__main__":
    main()
