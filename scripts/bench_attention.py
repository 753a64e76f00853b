"""Attention sweep: forward, backward and forward+backward time, TFLOP/s and extra peak memory of
every attention implementation over seqlen × causal × head_dim × dtype.

    python scripts/bench_attention.py                           # full default sweep (H200: a few minutes)
    python scripts/bench_attention.py --impls flash sdpa --seqlens 4096 8192 --dtypes bf16 --causal true
    python scripts/bench_attention.py --impls flash flash_fused sdpa --seqlens 8192 --dtypes bf16   # our two backwards
    python scripts/bench_attention.py --dtypes fp16 --append    # add points to an existing JSON
    python scripts/bench_attention.py --device cpu --quick      # smoke run without a GPU

Writes docs/results/attention_bench.json ({"meta", "rows"}; the JSON is rewritten after every
point, so an interrupted sweep keeps what it measured) and three plots under docs/. Batch ×
seqlen is held at --tokens (batch = max(1, tokens // seqlen)). A point that runs out of memory
is recorded with status "oom", one an implementation cannot run with "unsupported", and the
sweep goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

if __package__ in (None, ""):  # `python scripts/bench_attention.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.flops import attention_flops  # first: `kernels` picks the Triton backend before anything imports triton
import torch

from scripts._common import (
    AttnFn, PLOTS_DIR, RESULTS_DIR, Table, bench_ms, dtype_name, fill_defaults, parse_dtype, peak_extra_mib, pyplot, random_inputs, read_results, release_memory, resolve_device, rounded, run_guarded, run_meta, step_fns, write_results,
)
from scripts._impls import IMPL_NAMES, default_impls, make_impl

ROW_KEYS = (
    "impl", "dtype", "head_dim", "seqlen", "batch", "heads", "causal",
    "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_tflops", "bwd_tflops", "fwdbwd_tflops", "peak_mem_mib", "status",
)
POINT_KEYS = ROW_KEYS[:7]  # what identifies a point (used to merge runs with --append)

DEFAULTS = dict(seqlens=[512, 1024, 2048, 4096, 8192, 16384, 32768], tokens=16384, heads=16, head_dims=[64, 128],
                dtypes=["bfloat16", "float16"], warmup_ms=25.0, rep_ms=50.0)
QUICK = dict(seqlens=[32, 64], tokens=64, heads=2, head_dims=[16], dtypes=["bfloat16"], warmup_ms=1.0, rep_ms=5.0)

CONVENTION = (
    "FLOPs per (batch, head): forward 4*d*pairs, backward 10*d*pairs (2.5x forward, the recomputing "
    "backward's count, used for every impl so TFLOP/s compare like for like), fwd+bwd 14*d*pairs; "
    "pairs = N^2 without mask, N(N+1)/2 causal (exact visible pairs, i.e. the usual 'halved' figure). "
    "Times: median ms of triton.testing.do_bench (CUDA events, L2 flushed) after a warm-up call; "
    "bwd_ms = fwdbwd_ms - fwd_ms (null if noise makes it <= 0), the forward timed on inputs that require grad (as in training). "
    "peak_mem_mib: peak allocated during one forward+backward minus what was allocated before it "
    "(q, k, v, dO); it includes the output and the gradients. batch = max(1, tokens // seqlen). "
    "status: ok | oom | unsupported | error; failed points have null measurements (a forward that "
    "succeeded before the backward failed keeps its numbers)."
)


@dataclasses.dataclass(frozen=True)
class Point:
    impl: str
    dtype: str
    head_dim: int
    seqlen: int
    batch: int
    heads: int
    causal: bool


def sweep_points(
    impls: Iterable[str], dtypes: Iterable[str], head_dims: Iterable[int], causals: Iterable[bool],
    seqlens: Iterable[int], tokens: int, heads: int,
) -> list[Point]:
    """Every point of the sweep, one implementation after another (in the order given, so the
    compile-heavy flex, last by default, cannot hold up the others), each walking up in seqlen
    (its OOM frontier reads top to bottom in the printed table)."""
    return [
        Point(impl, dtype_name(parse_dtype(dt)), d, n, max(1, tokens // n), heads, causal)
        for impl in impls for dt in dtypes for d in head_dims for causal in causals for n in sorted(seqlens)
    ]


def tflops(flops: int, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flops / (ms * 1e-3) / 1e12


def bench_point(point: Point, attn: AttnFn | None, device: torch.device, warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    """One result row. Forward first, then forward+backward, so a point whose backward does not
    fit still reports its forward."""
    row: dict[str, Any] = {**dataclasses.asdict(point), **{k: None for k in ROW_KEYS[7:]}}
    if attn is None:  # the implementation could not even be built (reported when it was tried)
        row["status"] = "unsupported"
        return row
    label = f"{point.impl} {point.dtype} d={point.head_dim} N={point.seqlen} causal={point.causal}"

    def measure() -> None:
        q, k, v, do = random_inputs(point.batch, point.heads, point.seqlen, point.head_dim, parse_dtype(point.dtype), device)
        forward, forward_backward = step_fns(attn, q, k, v, do, point.causal)
        # bench_ms's first, untimed call compiles/autotunes; memory is read after that, on a warm call
        row["fwd_ms"] = bench_ms(forward, device, warmup_ms, rep_ms)
        row["fwdbwd_ms"] = bench_ms(forward_backward, device, warmup_ms, rep_ms)
        row["peak_mem_mib"] = peak_extra_mib(forward_backward, device)

    _, row["status"] = run_guarded(measure, device, label)
    release_memory(device)
    return finish_row(row)


def finish_row(row: dict[str, Any]) -> dict[str, Any]:
    """Derive bwd_ms and the TFLOP/s columns from the measured times (see CONVENTION)."""
    args = (row["batch"], row["heads"], row["seqlen"], row["seqlen"], row["head_dim"], row["causal"])
    fwd_flops, bwd_flops = attention_flops(*args, pass_="fwd"), attention_flops(*args, pass_="bwd")
    if row["fwd_ms"] is not None and row["fwdbwd_ms"] is not None and row["fwdbwd_ms"] > row["fwd_ms"]:
        row["bwd_ms"] = row["fwdbwd_ms"] - row["fwd_ms"]  # not measurable (None) if noise puts it <= 0
    row["fwd_tflops"] = tflops(fwd_flops, row["fwd_ms"])
    row["bwd_tflops"] = tflops(bwd_flops, row["bwd_ms"])
    row["fwdbwd_tflops"] = tflops(fwd_flops + bwd_flops, row["fwdbwd_ms"])
    for key in ROW_KEYS[7:-1]:
        row[key] = rounded(row[key])
    return {key: row[key] for key in ROW_KEYS}


def build_impls(names: Iterable[str], device: torch.device) -> dict[str, AttnFn | None]:
    """name -> attention function, or None when it cannot be built here (e.g. no FlexAttention)."""
    return {name: run_guarded(lambda: make_impl(name), device, f"{name} (building)")[0] for name in names}


def run_sweep(
    points: Iterable[Point], impls: Mapping[str, AttnFn | None], device: torch.device,
    warmup_ms: float, rep_ms: float, on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every point in order; `on_row` sees each row as soon as it exists."""
    rows = []
    for point in points:
        rows.append(bench_point(point, impls[point.impl], device, warmup_ms, rep_ms))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def merge_rows(old: Iterable[dict[str, Any]], new: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of `old` not re-measured in `new`, then `new` (for --append)."""
    new = list(new)
    measured = {tuple(r[k] for k in POINT_KEYS) for r in new}
    return [r for r in old if tuple(r[k] for k in POINT_KEYS) not in measured] + new


TABLE = Table([
    ("impl", "impl", 14, ""), ("dtype", "dtype", 8, ""), ("head_dim", "d", 4, ""), ("seqlen", "N", 6, ""),
    ("batch", "B", 4, ""), ("causal", "causal", 6, ""), ("fwd_ms", "fwd ms", 9, ".3f"), ("bwd_ms", "bwd ms", 9, ".3f"),
    ("fwdbwd_ms", "f+b ms", 9, ".3f"), ("fwd_tflops", "fwd TF/s", 8, ".1f"), ("bwd_tflops", "bwd TF/s", 8, ".1f"),
    ("fwdbwd_tflops", "f+b TF/s", 8, ".1f"), ("peak_mem_mib", "mem MiB", 9, ".0f"), ("status", "status", 11, ""),
])


# ----------------------------------------------------------------------------------------------
# Plots: one panel per (dtype, head_dim) × causal, one line per implementation
# ----------------------------------------------------------------------------------------------

PLOTS = {
    # file name: (y value of a row, y label, log y)
    "attention_time.png": (lambda r: r["fwdbwd_ms"], "forward+backward time (ms)", True),
    "attention_memory.png": (lambda r: None if r["peak_mem_mib"] is None else r["peak_mem_mib"] / r["batch"],
                             "extra peak memory per sequence (MiB)", True),
    "attention_tflops.png": (lambda r: r["fwdbwd_tflops"], "forward+backward TFLOP/s", False),
}


def plot_results(rows: list[dict[str, Any]], plot_dir: Path) -> list[Path]:
    """Time, memory and TFLOP/s vs seqlen; a dotted vertical line marks where an implementation
    first ran out of memory. Memory is per sequence, so at fixed tokens the N×N implementations
    rise as N² and the tiled ones as N (dashed reference slopes)."""
    plt = pyplot()
    plot_dir.mkdir(parents=True, exist_ok=True)
    panels = sorted({(r["dtype"], r["head_dim"]) for r in rows})
    causals = sorted({r["causal"] for r in rows})
    present = {r["impl"] for r in rows}
    impls = [n for n in IMPL_NAMES if n in present] + sorted(present - set(IMPL_NAMES))
    extra = [n for n in impls if n not in IMPL_NAMES]
    colors = {name: f"C{i % 10}" for i, name in enumerate([*IMPL_NAMES, *extra])}  # one color per impl in every plot
    written = []
    for filename, (value, ylabel, logy) in PLOTS.items():
        height = 3.8 * len(panels) + 0.7  # + room for the shared legend on top
        fig, axes = plt.subplots(len(panels), len(causals), figsize=(5.5 * len(causals), height), squeeze=False)
        for (dtype, d), ax_row in zip(panels, axes):
            for causal, ax in zip(causals, ax_row):
                panel = [r for r in rows if (r["dtype"], r["head_dim"], r["causal"]) == (dtype, d, causal)]
                _plot_panel(ax, panel, impls, colors, value, logy, reference_slopes=filename == "attention_memory.png")
                ax.set_title(f"{dtype}, head_dim {d}, {'causal' if causal else 'non-causal'}", fontsize=9)
                ax.set_xlabel("seqlen")
                ax.set_ylabel(ylabel, fontsize=8)
        handles = {}
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        if handles:
            fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=min(6, len(handles)), fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / height))
        path = plot_dir / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _plot_panel(ax, panel, impls, colors, value, logy: bool, reference_slopes: bool) -> None:
    from matplotlib.ticker import NullLocator

    for name in impls:
        pts = sorted((r["seqlen"], value(r)) for r in panel if r["impl"] == name and r["status"] == "ok" and value(r) is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color=colors[name], label=name)
        ooms = sorted(r["seqlen"] for r in panel if r["impl"] == name and r["status"] == "oom")
        if ooms:
            ax.axvline(ooms[0], color=colors[name], ls=":", lw=1.2, label=f"{name} OOM from here")
    ax.set_xscale("log", base=2)
    seqlens = sorted({r["seqlen"] for r in panel})
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(seqlens, [str(n) for n in seqlens], fontsize=7)
    if logy:
        ax.set_yscale("log")
    ys = [value(r) for r in panel if r["status"] == "ok" and value(r)]
    if reference_slopes and ys:
        n0, y0 = seqlens[0], min(ys)
        for power, label in ((1, "∝ N"), (2, "∝ N²")):
            ax.plot(seqlens, [y0 * (n / n0) ** power for n in seqlens], ls="--", lw=0.8, color="0.6" if power == 1 else "0.3", label=label)
    ax.grid(True, which="both", alpha=0.3)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

CAUSAL_CHOICES = {"both": [False, True], "true": [True], "false": [False]}


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
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "attention_bench.json")
    p.add_argument("--plot-dir", type=Path, default=PLOTS_DIR)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--append", action="store_true", help="merge into --out: keep its rows that this run does not re-measure")
    args = p.parse_args(argv)
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
    print(TABLE.header(), flush=True)
    new_rows: list[dict[str, Any]] = []
    start = last = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        nonlocal last
        new_rows.append(row)
        now = time.perf_counter()
        print(f"{TABLE.line(row)} {now - last:6.1f}s", flush=True)  # wall time per point, to budget sweeps
        last = now
        write_results(args.out, meta, merge_rows(old_rows, new_rows))

    run_sweep(points, impls, device, args.warmup_ms, args.rep_ms, on_row)
    rows = merge_rows(old_rows, new_rows)
    write_results(args.out, meta, rows)
    print(f"wrote {args.out} ({len(rows)} rows) after {time.perf_counter() - start:.0f} s", flush=True)
    if not args.no_plots and rows:
        for path in plot_results(rows, args.plot_dir):
            print(f"wrote {path}", flush=True)
    return rows


if __name__ == "__main__":
    main()
