"""The FlashAttention paper's Figure 2 (left and middle), measured on this machine.

Left: forward+backward of attention at the GPT-2 medium shape (batch 64, 16 heads, seqlen 1024,
head_dim 64, fp16, causal) for naive, our flash and SDPA's default: GFLOPs (analytic and as
counted by FlopCounterMode, backward separately so the recompute shows: 10·N²·d vs 8·N²·d per
head), HBM read/write GB and runtime. Middle: our forward at several BLOCK_N: HBM GB and ms.

    python scripts/paper_table.py                   # GPU; HBM from Nsight Compute when `ncu` is on PATH
    python scripts/paper_table.py --ncu off         # analytic HBM model instead of ncu
    python scripts/paper_table.py --device cpu --quick
    python scripts/paper_table.py --out docs/results/paper_table.json   # update the committed results

HBM with ncu: each implementation's pass (and each block size's forward) runs once more in a child
process under ncu (`python -m bench.ncu_child`, see bench/ncu.py), which counts the DRAM bytes of
exactly that pass. Without ncu (or if it fails, e.g. no permission for GPU counters) the analytic
IO model of bench/hbm.py is used and `hbm_source` says "analytic".

Writes outputs/bench/<date>/paper_table/paper_table.json ({"meta", "rows", "block_study"}) and
paper_table.md beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch

from bench.cli import fill_defaults, parse_dtype, resolve_device
from bench.failures import run_guarded
from bench.flops import analytic_gflops, counted_gflops
from bench.hbm import analytic_hbm_bytes, forward_hbm_bytes
from bench.impls import IMPL_NAMES, make_impl
from bench.inputs import Shape, step_fns
from bench.ncu import child_args, measure_hbm_ncu
from bench.results import default_out, rounded, run_meta, write_results, write_text
from bench.tables import Column, Table, markdown_grid
from bench.tiles import config, forward_at
from bench.timing import bench_ms

SCRIPT = "paper_table"
# Figure 2 (left) of Dao et al. 2022, A100: standard attention vs FlashAttention.
PAPER_A100 = {"standard": {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7},
              "flashattention": {"gflops": 75.2, "hbm_gb": 4.4, "runtime_ms": 7.3}}
ROW_KEYS = ("impl", "gflops_fwd", "gflops_bwd", "gflops_fwd_counted", "gflops_bwd_counted",
            "hbm_read_gb", "hbm_write_gb", "hbm_source", "runtime_ms", "status")
BLOCK_KEYS = ("impl", "block_m", "block_n", "fwd_ms", "hbm_read_gb", "hbm_write_gb", "hbm_source", "max_abs_diff_vs_default", "status")

CONVENTION = (
    "GFLOPs analytic (kernels.flops): forward 4*d*pairs; backward 10*d*pairs for implementations that "
    "recompute S = QK^T (flash, SDPA's fused backends), 8*d*pairs for naive, which keeps P. "
    "pairs = N^2, or the exact visible N(N+1)/2 when causal, except naive, which computes the full "
    "N x N square before masking it. 'counted' = torch.utils.flop_counter.FlopCounterMode "
    "(matmuls for naive, the registered formula for our op and for SDPA; torch's SDPA formula ignores "
    "is_causal). HBM GB = 1e9 bytes. runtime_ms = median forward+backward (triton.testing.do_bench)."
)


def _hbm(row: dict[str, Any], ncu: str | None, args: list[str], analytic: tuple[float, float] | None) -> None:
    """Fill the row's HBM columns from ncu when it measured, else from the analytic model."""
    hbm = measure_hbm_ncu(ncu, args) if ncu and row["status"] == "ok" else None
    if hbm is not None:
        row["hbm_read_gb"], row["hbm_write_gb"], _ = hbm
        row["hbm_source"] = "ncu"
    elif analytic is not None:
        row["hbm_read_gb"], row["hbm_write_gb"], row["hbm_source"] = analytic[0] / 1e9, analytic[1] / 1e9, "analytic"


def measure_impl(impl: str, shape: Shape, device: torch.device, ncu: str | None, warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    row: dict[str, Any] = {key: None for key in ROW_KEYS}
    row["impl"] = impl
    row["gflops_fwd"], row["gflops_bwd"] = analytic_gflops(impl, shape)

    def measure() -> None:
        attn = make_impl(impl)
        row["gflops_fwd_counted"], row["gflops_bwd_counted"] = counted_gflops(attn, shape, device)
        q, k, v, do = shape.inputs(device)
        _, forward_backward = step_fns(attn, q, k, v, do, shape.causal)
        row["runtime_ms"] = bench_ms(forward_backward, device, warmup_ms, rep_ms)

    _, row["status"] = run_guarded(measure, device, impl)
    _hbm(row, ncu, child_args(impl, shape, device, "fwdbwd"), analytic_hbm_bytes(impl, shape))
    return {k: rounded(v) if isinstance(v, float) else v for k, v in row.items()}


def measure_block(shape: Shape, block_m: int | None, block_n: int, device: torch.device, ncu: str | None,
                  warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    """Our forward (no grad) with forced tile sizes: ms, HBM, and the largest difference from the
    output at the kernel's default tiles (a forced config must not change the result)."""
    row: dict[str, Any] = {key: None for key in BLOCK_KEYS}
    cfg = config("fwd", shape.head_dim, parse_dtype(shape.dtype), shape.causal, BLOCK_M=block_m, BLOCK_N=block_n)
    row["impl"], row["block_m"], row["block_n"] = "flash", cfg.BLOCK_M, cfg.BLOCK_N

    def measure() -> None:
        q, k, v, _ = shape.inputs(device, requires_grad=False)
        reference = make_impl("flash")(q, k, v, shape.causal)
        forced = forward_at(cfg)
        out = forced(q, k, v, shape.causal)
        row["fwd_ms"] = bench_ms(lambda: forced(q, k, v, shape.causal), device, warmup_ms, rep_ms)
        row["max_abs_diff_vs_default"] = (out.float() - reference.float()).abs().max().item()

    _, row["status"] = run_guarded(measure, device, f"flash fwd BLOCK_M={cfg.BLOCK_M} BLOCK_N={cfg.BLOCK_N}")
    _hbm(row, ncu, child_args("flash", shape, device, "fwd", block_m, block_n), forward_hbm_bytes(shape, cfg.BLOCK_M))
    return {k: rounded(v) if isinstance(v, float) else v for k, v in row.items()}


def _total(row: dict[str, Any], a: str, b: str) -> float | None:
    return None if row[a] is None or row[b] is None else row[a] + row[b]


def _f(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(meta: dict[str, Any], shape: Shape, rows: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> str:
    """The paper table beside Figure 2's A100 numbers, the block-size study, and notes."""
    f = _f
    names = {"flash": "flash (ours)"}
    head = ["", *(names.get(r["impl"], r["impl"]) for r in rows), "paper A100: standard", "paper A100: FlashAttention"]
    std, fa = PAPER_A100["standard"], PAPER_A100["flashattention"]
    body = [
        ["GFLOPs fwd+bwd (analytic)", *(f(_total(r, "gflops_fwd", "gflops_bwd")) for r in rows), f(std["gflops"]), f(fa["gflops"])],
        ["GFLOPs fwd / bwd (analytic)", *(f"{f(r['gflops_fwd'])} / {f(r['gflops_bwd'])}" for r in rows), "-", "-"],
        ["GFLOPs fwd / bwd (FlopCounterMode)", *(f"{f(r['gflops_fwd_counted'])} / {f(r['gflops_bwd_counted'])}" for r in rows), "-", "-"],
        ["HBM read / write GB", *(f"{f(r['hbm_read_gb'], '.2f')} / {f(r['hbm_write_gb'], '.2f')}" for r in rows), "-", "-"],
        ["HBM R+W GB", *(f"{f(_total(r, 'hbm_read_gb', 'hbm_write_gb'), '.2f')} ({r['hbm_source']})" for r in rows), f(std["hbm_gb"]), f(fa["hbm_gb"])],
        ["runtime ms (fwd+bwd)", *(f(r["runtime_ms"], ".2f") for r in rows), f(std["runtime_ms"]), f(fa["runtime_ms"])],
        ["status", *(r["status"] for r in rows), "", ""],
    ]
    lines = [
        "## Attention forward+backward at the GPT-2 medium shape (paper Fig. 2, left)",
        "",
        f"batch {shape.batch}, {shape.heads} heads, seqlen {shape.seqlen}, head_dim {shape.head_dim}, {shape.dtype}, "
        f"{'causal' if shape.causal else 'non-causal'}; {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"CUDA {meta['cuda']}, {meta['date']}, git {meta['git_rev']}.",
        "",
        markdown_grid(head, body),
        "",
    ]
    by_impl = {r["impl"]: r for r in rows}
    if "naive" in by_impl and "flash" in by_impl:
        n, o = by_impl["naive"], by_impl["flash"]
        hbm_n, hbm_o = _total(n, "hbm_read_gb", "hbm_write_gb"), _total(o, "hbm_read_gb", "hbm_write_gb")
        ratios = []
        if hbm_n and hbm_o:
            ratios.append(f"HBM traffic naive / ours = {hbm_n / hbm_o:.1f}x ({n['hbm_source']}) (paper: {std['hbm_gb'] / fa['hbm_gb']:.1f}x)")
        if n["runtime_ms"] and o["runtime_ms"]:
            ratios.append(f"runtime naive / ours = {n['runtime_ms'] / o['runtime_ms']:.1f}x (paper: {std['runtime_ms'] / fa['runtime_ms']:.1f}x)")
        flops_n, flops_o = _total(n, "gflops_fwd", "gflops_bwd"), _total(o, "gflops_fwd", "gflops_bwd")
        ratios.append(f"GFLOPs ours / naive = {flops_o / flops_n:.3f} (paper: {fa['gflops'] / std['gflops']:.3f})")
        lines += ["- " + r for r in ratios] + [""]
    for r in rows:
        for part in ("fwd", "bwd"):
            analytic, counted = r[f"gflops_{part}"], r[f"gflops_{part}_counted"]
            if counted is not None and abs(counted - analytic) > 1e-3 * analytic:
                lines.append(f"- {r['impl']} {part}: FlopCounterMode counts {counted:.1f} GFLOPs, the analytic count is {analytic:.1f} "
                             f"(ratio {counted / analytic:.3f}).")
    lines += [f"- Conventions: {CONVENTION}", ""]
    if blocks:
        study = [[f(b["block_m"], "d"), f(b["block_n"], "d"), f(b["fwd_ms"], ".3f"),
                  f"{f(b['hbm_read_gb'], '.3f')} / {f(b['hbm_write_gb'], '.3f')}", b["hbm_source"] or "-",
                  f(b["max_abs_diff_vs_default"], ".2g"), b["status"]] for b in blocks]
        lines += [
            "## Block-size study: our forward at several BLOCK_N (paper Fig. 2, middle)",
            "",
            markdown_grid(["BLOCK_M", "BLOCK_N", "fwd ms", "HBM read / write GB", "source", "max abs diff vs default tiles", "status"], study),
            "",
        ]
    return "\n".join(lines)


TABLE = Table([
    Column("impl", "impl"), Column("gflops_fwd", "GF fwd", ".1f"), Column("gflops_bwd", "GF bwd", ".1f"),
    Column("gflops_fwd_counted", "cnt fwd", ".1f"), Column("gflops_bwd_counted", "cnt bwd", ".1f"),
    Column("hbm_read_gb", "HBM rd GB", ".3f"), Column("hbm_write_gb", "HBM wr GB", ".3f"), Column("hbm_source", "source"),
    Column("runtime_ms", "ms", ".3f"), Column("status", "status"),
])

QUICK = dict(batch=2, heads=2, seqlen=64, head_dim=16, block_n=[32, 64], warmup_ms=1.0, rep_ms=5.0)
DEFAULTS = dict(batch=64, heads=16, seqlen=1024, head_dim=64, block_n=[32, 64, 128, 256], warmup_ms=25.0, rep_ms=100.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--batch", type=int, help=f"default {d['batch']}")
    p.add_argument("--heads", type=int, help=f"default {d['heads']}")
    p.add_argument("--seqlen", type=int, help=f"default {d['seqlen']}")
    p.add_argument("--head-dim", type=int, help=f"default {d['head_dim']}")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True, help="GPT-2 is causal (default)")
    p.add_argument("--impls", nargs="+", choices=IMPL_NAMES, default=["naive", "flash", "sdpa"])
    p.add_argument("--block-n", nargs="*", type=int, help=f"BLOCK_N values of the study (default {d['block_n']}; none: skip it)")
    p.add_argument("--block-m", type=int, help="force BLOCK_M too in the study (default: the kernel's choice)")
    p.add_argument("--ncu", choices=("auto", "off"), default="auto", help="auto: Nsight Compute when `ncu` is on PATH and CUDA is used")
    p.add_argument("--device", help="cuda (default when present) or cpu")
    p.add_argument("--warmup-ms", type=float)
    p.add_argument("--rep-ms", type=float)
    p.add_argument("--quick", action="store_true", help=f"CPU smoke run: {QUICK}; explicit flags still win")
    p.add_argument("--out", type=Path, help=f"result JSON, the markdown goes beside it (.md) (default {default_out(SCRIPT, 'paper_table.json')})")
    args = p.parse_args(argv)
    args.out = args.out or default_out(SCRIPT, "paper_table.json")
    return fill_defaults(p, args, DEFAULTS, QUICK, dtype_keys=["dtype"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    shape = Shape(args.batch, args.heads, args.seqlen, args.head_dim, args.dtype, args.causal)
    ncu = shutil.which("ncu") if args.ncu == "auto" and device.type == "cuda" else None
    meta = run_meta(device, CONVENTION, shape=dataclasses.asdict(shape), hbm_tool=ncu or "analytic model", paper_a100=PAPER_A100)
    print(f"paper table on {meta['gpu']}: {shape}; HBM from {'ncu (' + ncu + ')' if ncu else 'the analytic model'}", flush=True)
    rows = []
    for impl in args.impls:
        rows.append(measure_impl(impl, shape, device, ncu, args.warmup_ms, args.rep_ms))
        print(TABLE.line(rows[-1]), flush=True)
    blocks = []
    for block_n in args.block_n:
        blocks.append(measure_block(shape, args.block_m, block_n, device, ncu, args.warmup_ms, args.rep_ms))
        print(f"  block study: BLOCK_M={blocks[-1]['block_m']} BLOCK_N={block_n}: fwd {blocks[-1]['fwd_ms']} ms, "
              f"HBM {blocks[-1]['hbm_read_gb']} / {blocks[-1]['hbm_write_gb']} GB ({blocks[-1]['hbm_source']}), {blocks[-1]['status']}", flush=True)
    write_results(args.out, meta, rows, block_study=blocks)
    text = markdown(meta, shape, rows, blocks)
    write_text(args.out.with_suffix(".md"), text)
    print("\n" + TABLE.render(rows) + "\n\n" + text, flush=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}", flush=True)
    return {"meta": meta, "rows": rows, "block_study": blocks}


if __name__ == "__main__":
    main()
