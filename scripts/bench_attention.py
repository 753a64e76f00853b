"""Attention sweep: forward, backward and forward+backward time, TFLOP/s and extra peak memory of
every attention implementation over seqlen × causal × head_dim × dtype.

    python scripts/bench_attention.py                           # full default sweep (H200: a few minutes)
    python scripts/bench_attention.py --impls flash sdpa --seqlens 4096 8192 --dtypes bf16 --causal true
    python scripts/bench_attention.py --impls flash flash_fused sdpa --seqlens 8192 --dtypes bf16   # our two backwards
    python scripts/bench_attention.py --dtypes fp16 --append    # add points to an existing JSON
    python scripts/bench_attention.py --device cpu --quick      # smoke run without a GPU
    python scripts/bench_attention.py --out docs/results/attention_bench.json --plot-dir docs   # update the committed results
    python scripts/bench_attention.py --masks --seqlens 8192 32768 --dtypes bf16 --head-dims 64   # mask rows (bench/masks.py)
    python scripts/bench_attention.py --masks --device cpu --quick   # mask rows' smoke run (flex eager on CPU)
    python scripts/bench_attention.py --seqlens 1024 2048 --autograd-thread caller   # short calls without autograd's thread hand-offs

Writes outputs/bench/<date>/bench_attention/attention_bench.json ({"meta", "rows"}; rewritten
after every point, so an interrupted sweep keeps what it measured) and three plots beside it.
Batch × seqlen is held at --tokens (batch = max(1, tokens // seqlen)). A point that runs out of
memory is recorded with status "oom", one an implementation cannot run with "unsupported", and
the sweep goes on.

--masks measures masked attention instead (bench/masks.py): document masks (the stdlib corpus's real
documents, 8 equal ones) and causal sliding windows, ours vs FlexAttention vs SDPA, written to the
JSON's "mask_rows" (its "rows" are kept).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from bench.cli import CAUSAL_CHOICES, fill_defaults, parse_dtype, resolve_device
from bench.impls import IMPL_NAMES, default_impls
from bench.masks import DEFAULT_MASKS, MASK_IMPLS, MASK_ROW_KEYS, corpus_document_ids, mask_rows
from bench.plots import plot_attention_sweep
from bench.results import default_out, read_results, run_meta, write_results
from bench.sweep import CONVENTION, build_impls, merge_rows, run_sweep, sweep_points
from bench.tables import Column, Table
from bench.timing import TIMERS

# where autograd runs each backward: PyTorch's default hands it to a worker thread per device and
# back (two thread wake-ups per call, which a short call's per-call time includes), or the caller
AUTOGRAD_THREADS = {
    "device": "autograd's per-device worker thread (PyTorch's default)",
    "caller": "the calling thread (torch.autograd.set_multithreading_enabled(False))",
}

SCRIPT = "bench_attention"
DEFAULTS = dict(seqlens=[512, 1024, 2048, 4096, 8192, 16384, 32768], tokens=16384, heads=16, head_dims=[64, 128],
                dtypes=["bfloat16", "float16"], warmup_ms=25.0, rep_ms=50.0)
QUICK = dict(seqlens=[32, 64], tokens=64, heads=2, head_dims=[16], dtypes=["bfloat16"], warmup_ms=1.0, rep_ms=5.0)
QUICK_MASKS = ["causal", "docs_corpus", "docs_8", "window_16"]
QUICK_CORPUS_FILES = 40  # --quick: tokenise a few stdlib files, not all of them

MASK_TABLE = Table([
    Column("impl", "impl"), Column("mask", "mask"), Column("seqlen", "N"), Column("batch", "B"),
    Column("visible_fraction", "visible", ".3f"), Column("fwd_ms", "fwd ms", ".3f"), Column("fwdbwd_ms", "f+b ms", ".3f"),
    Column("fwdbwd_tflops", "f+b TF/s", ".1f"), Column("speedup_vs_causal", "vs causal", ".2f"),
    Column("max_abs_diff", "max diff", ".2g"), Column("status", "status"),
])

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
    p.add_argument("--timer", choices=list(TIMERS), default="events",
                   help="events: each call alone (host launch work counts where it is longer than the GPU's); "
                        "cudagraph: calls replayed from a CUDA graph (GPU time only; CUDA only)")
    p.add_argument("--autograd-thread", choices=list(AUTOGRAD_THREADS), default="device",
                   help="device: backward on autograd's worker thread, PyTorch's default; caller: on the calling thread, "
                        "without the two thread hand-offs per call that per-call times at N <= 2048 include")
    p.add_argument("--interleave", action="store_true",
                   help="time the impls of each shape back to back (default: one impl's whole sweep after another)")
    p.add_argument("--append", action="store_true", help="merge into --out: keep its rows that this run does not re-measure")
    p.add_argument("--masks", nargs="*", metavar="MASK", help=f"mask rows instead of the dense sweep (no names: {' '.join(DEFAULT_MASKS)})")
    p.add_argument("--mask-impls", nargs="+", choices=MASK_IMPLS, default=list(MASK_IMPLS))
    p.add_argument("--corpus-max-files", type=int, help="docs_corpus: tokenise at most this many stdlib files (default all)")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache"), help="docs_corpus: the data cache (tokenizer, token files)")
    args = p.parse_args(argv)
    args.out = args.out or default_out(SCRIPT, "attention_bench.json")
    args.plot_dir = args.plot_dir or args.out.parent
    return fill_defaults(p, args, DEFAULTS, QUICK, dtype_keys=["dtypes"])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    if args.timer == "cudagraph" and device.type != "cuda":
        raise SystemExit("--timer cudagraph replays CUDA graphs: it needs a CUDA device (on the CPU leave the default, events)")
    # thread-local, and the previous setting comes back on exit
    with torch.autograd.set_multithreading_enabled(args.autograd_thread == "device"):
        if args.masks is not None:
            return main_masks(args, device)
        return main_sweep(args, device)


def main_sweep(args: argparse.Namespace, device) -> list[dict[str, Any]]:
    """The dense sweep: every impl × dtype × head dim × causal × seqlen."""
    impl_names = args.impls or default_impls(device)
    points = sweep_points(impl_names, args.dtypes, args.head_dims, CAUSAL_CHOICES[args.causal], args.seqlens, args.tokens,
                          args.heads, interleave=args.interleave)
    meta = run_meta(device, CONVENTION, timer=args.timer, autograd_thread=AUTOGRAD_THREADS[args.autograd_thread])
    meta["order"] = "interleaved: the impls of each shape back to back" if args.interleave else "one impl's sweep after another"
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

    run_sweep(points, impls, device, args.warmup_ms, args.rep_ms, on_row, timer=args.timer)
    rows = merge_rows(old_rows, new_rows)
    write_results(args.out, meta, rows)
    print("\n" + TABLE.render(rows), flush=True)
    print(f"wrote {args.out} ({len(rows)} rows) after {time.perf_counter() - start:.0f} s", flush=True)
    if not args.no_plots and rows:
        for path in plot_attention_sweep(rows, args.plot_dir):
            print(f"wrote {path}", flush=True)
    return rows


def main_masks(args: argparse.Namespace, device) -> list[dict[str, Any]]:
    """The mask rows: every mask × impl at each dtype, head dim and seqlen (batch = tokens // seqlen)."""
    masks = args.masks or (QUICK_MASKS if args.quick else list(DEFAULT_MASKS))
    max_files = args.corpus_max_files or (QUICK_CORPUS_FILES if args.quick else None)
    corpus = lambda batch, seqlen: corpus_document_ids(batch, seqlen, args.cache_dir, max_files)  # noqa: E731
    meta = run_meta(device, f"mask rows: {MASK_ROW_KEYS}; bench/masks.py", timer=args.timer,
                    autograd_thread=AUTOGRAD_THREADS[args.autograd_thread])
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes:
        for head_dim in args.head_dims:
            for seqlen in sorted(args.seqlens):
                rows += mask_rows(args.mask_impls, masks, parse_dtype(dtype), head_dim, seqlen, max(1, args.tokens // seqlen),
                                  args.heads, device, corpus, args.warmup_ms, args.rep_ms, args.timer)
                print(MASK_TABLE.render(rows[-len(masks) * len(args.mask_impls):]), flush=True)
    previous = read_results(args.out)["rows"] if args.append and args.out.exists() else []
    write_results(args.out, meta, previous, mask_rows=rows)
    print(f"wrote {args.out} ({len(rows)} mask rows)", flush=True)
    return rows


if __name__ == "__main__":
    main()
