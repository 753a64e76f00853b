"""The FlashAttention paper's Figure 2 (left and middle), measured on this machine.

Left: forward+backward of attention at the GPT-2 medium shape (batch 64, 16 heads, seqlen 1024,
head_dim 64, fp16, causal) for naive, our flash and SDPA's default: GFLOPs (analytic and as
counted by FlopCounterMode, backward separately so the recompute shows: 10·N²·d vs 8·N²·d per
head), HBM read/write GB and runtime. Middle: our forward at several BLOCK_N: HBM GB and ms.

    python scripts/paper_table.py                   # GPU; HBM from Nsight Compute when `ncu` is on PATH
    python scripts/paper_table.py --ncu off         # analytic HBM model instead of ncu
    python scripts/paper_table.py --device cpu --quick

HBM with ncu: the script re-runs itself under `ncu --clock-control none --metrics
dram__bytes_read.sum,dram__bytes_write.sum --profile-from-start off`, once per implementation
(and per block size). The child warms up (compiles, autotunes) first, then brackets exactly one
forward+backward with cudaProfilerStart/Stop, so only that pass's kernels are counted; the
bytes are summed over those kernels. Without ncu (or if it fails, e.g. no permission for GPU
counters) the analytic IO model below is used and `hbm_source` says "analytic".

Writes docs/results/paper_table.json ({"meta", "rows", "block_study"}) and paper_table.md beside it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterable

if __package__ in (None, ""):  # `python scripts/paper_table.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.flops import attention_flops  # first: `kernels` picks the Triton backend before anything imports triton
import torch
from torch.utils.flop_counter import FlopCounterMode

from scripts._common import (
    AttnFn, RESULTS_DIR, Table, bench_ms, fill_defaults, parse_dtype, random_inputs, resolve_device, rounded, run_guarded, run_meta, step_fns, synchronize, write_results,
)
from scripts._impls import IMPL_NAMES, make_impl

SCRIPT = Path(__file__).resolve()
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
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


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool

    @property
    def elem(self) -> int:
        return parse_dtype(self.dtype).itemsize

    def flops(self, pass_: str, causal: bool | None = None) -> int:
        causal = self.causal if causal is None else causal
        return attention_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, causal, pass_)

    def cli(self) -> list[str]:
        return ["--batch", str(self.batch), "--heads", str(self.heads), "--seqlen", str(self.seqlen),
                "--head-dim", str(self.head_dim), "--dtype", self.dtype, "--causal" if self.causal else "--no-causal"]


# ----------------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------------


def analytic_gflops(impl: str, shape: Shape) -> tuple[float, float]:
    """(forward, backward) GFLOPs of the work `impl` does (see CONVENTION)."""
    if impl in ("naive", "sdpa_math"):  # materialise the full N×N scores, mask afterwards, keep P
        return shape.flops("fwd", causal=False) / 1e9, shape.flops("bwd_stored_p", causal=False) / 1e9
    return shape.flops("fwd") / 1e9, shape.flops("bwd") / 1e9


def counted_gflops(attn: AttnFn, shape: Shape, device: torch.device) -> tuple[float, float]:
    """(forward, backward) GFLOPs as torch's FlopCounterMode counts one pass each."""
    q, k, v, do = random_inputs(shape.batch, shape.heads, shape.seqlen, shape.head_dim, parse_dtype(shape.dtype), device)
    with FlopCounterMode(display=False) as counter:
        o = attn(q, k, v, shape.causal)
    fwd = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        torch.autograd.grad(o, (q, k, v), do)
    return fwd / 1e9, counter.get_total_flops() / 1e9


# ----------------------------------------------------------------------------------------------
# Analytic HBM model (used when ncu is not available)
# ----------------------------------------------------------------------------------------------


def naive_hbm_bytes(shape: Shape) -> tuple[float, float]:
    """(read, write) bytes of model.attention.naive_attention, forward+backward, assuming every
    op reads its operands from HBM and writes its result there (no N×N tensor fits in L2).
    `sq` is one (B, H, N, N) tensor, `nd` one (B, H, N, d) tensor."""
    sq = shape.batch * shape.heads * shape.seqlen**2 * shape.elem
    nd = shape.batch * shape.heads * shape.seqlen * shape.head_dim * shape.elem
    masked = shape.causal
    ops = [  # (reads, writes)
        (2 * nd, sq),       # S = Q Kᵀ
        (sq, sq),           # S · scale
        (sq, sq) if masked else (0, 0),  # masked_fill(-inf)
        (sq, sq),           # P = softmax(S)
        (sq + nd, nd),      # O = P V
        (sq + nd, nd),      # backward: dV = Pᵀ dO
        (2 * nd, sq),       # dP = dO Vᵀ
        (2 * sq, sq),       # dS = softmax_backward(dP, P)
        (sq, sq) if masked else (0, 0),  # masked_fill backward
        (sq, sq),           # · scale backward
        (sq + nd, nd),      # dQ = dS K
        (sq + nd, nd),      # dK = dSᵀ Q
    ]
    return float(sum(r for r, _ in ops)), float(sum(w for _, w in ops))


def fused_hbm_bytes(shape: Shape, impl: str) -> tuple[float, float]:
    """(read, write) bytes of a fused (tiled) forward+backward: each kernel reads its operands once
    and writes its results once; re-reads of K/V tiles by other query blocks are assumed to hit L2.
    Ours runs four kernels (forward, preprocess, dK/dV, dQ); flash_fused replaces the last two by one
    that adds dQ into a float32 buffer (zeroed first, atomics assumed to meet in L2, so the buffer
    is read and written back once) and a cast. SDPA's fused backends are modelled as the compulsory
    traffic: q, k, v read and o written forward; q, k, v, o, dO read and dq, dk, dv written backward.
    `nd` is one (B, H, N, d) tensor, `nd32` the same in float32, `stat` one fp32 (B, H, N) row statistic."""
    nd = shape.batch * shape.heads * shape.seqlen * shape.head_dim * shape.elem
    nd32 = shape.batch * shape.heads * shape.seqlen * shape.head_dim * 4
    stat = shape.batch * shape.heads * shape.seqlen * 4
    if impl == "flash":
        kernels = [  # (reads, writes)
            (3 * nd, nd + stat),                # forward: q, k, v -> o, lse
            (2 * nd, stat),                     # preprocess: o, dO -> delta = rowsum(dO ∘ O)
            (4 * nd + 2 * stat, 2 * nd),        # dK/dV: q, k, v, dO, lse, delta -> dk, dv
            (4 * nd + 2 * stat, nd),            # dQ: q, k, v, dO, lse, delta -> dq
        ]
    elif impl == "flash_fused":
        kernels = [
            (3 * nd, nd + stat),                        # forward
            (2 * nd, stat),                             # preprocess
            (0, nd32),                                  # zero the float32 dQ buffer
            (4 * nd + 2 * stat + nd32, 2 * nd + nd32),  # fused: q, k, v, dO, lse, delta, dQ buffer -> dk, dv, dQ buffer
            (nd32, nd),                                 # cast dQ to the input dtype
        ]
    else:
        kernels = [(3 * nd, nd + stat), (5 * nd + stat, 3 * nd)]
    return float(sum(r for r, _ in kernels)), float(sum(w for _, w in kernels))


def analytic_hbm_bytes(impl: str, shape: Shape) -> tuple[float, float]:
    return naive_hbm_bytes(shape) if impl in ("naive", "sdpa_math") else fused_hbm_bytes(shape, impl)


def forward_hbm_bytes(shape: Shape, block_m: int) -> tuple[float, float]:
    """(read, write) bytes of our forward with BLOCK_M query rows per program, counting every K/V
    tile load as HBM traffic (no L2 reuse, the paper's Theorem 2 accounting): each of the
    ceil(N / BLOCK_M) query blocks streams the keys it can see (about half when causal)."""
    nd = shape.batch * shape.heads * shape.seqlen * shape.head_dim * shape.elem
    blocks = -(-shape.seqlen // block_m)
    kv_passes = (blocks + 1) / 2 if shape.causal else blocks
    return nd + 2 * nd * kv_passes, float(nd + shape.batch * shape.heads * shape.seqlen * 4)


# ----------------------------------------------------------------------------------------------
# Nsight Compute
# ----------------------------------------------------------------------------------------------

# Scale of the units ncu may print (SI prefixes, as Nsight Compute uses; binary ones just in case).
BYTE_UNITS = {"byte": 1, "bytes": 1, "b": 1, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9, "gb": 1e9,
              "tbyte": 1e12, "tb": 1e12, "kibyte": 2**10, "kib": 2**10, "mibyte": 2**20, "mib": 2**20, "gibyte": 2**30, "gib": 2**30}


def parse_ncu_csv(text: str, metrics: Iterable[str] = NCU_METRICS) -> tuple[dict[str, float], int]:
    """Sum each metric over all profiled kernels of `ncu --csv` output, in bytes; also return the
    number of kernels. ncu's own lines (==PROF==, warnings) and the program's output around the
    table are skipped; values may carry thousands separators and scaled units (Kbyte, Mbyte, ...)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    totals = {m: 0.0 for m in metrics}
    if start is None:
        return totals, 0
    kernels = set()
    for row in csv.DictReader(lines[start:]):
        name = row.get("Metric Name")
        if name not in totals or not (row.get("ID") or "").strip().isdigit():
            continue
        unit = (row.get("Metric Unit") or "byte").strip().lower()
        if unit not in BYTE_UNITS:
            raise ValueError(f"ncu printed {name} in unit {row['Metric Unit']!r}; expected one of {sorted(BYTE_UNITS)}")
        totals[name] += float(row["Metric Value"].replace(",", "")) * BYTE_UNITS[unit]
        kernels.add(row["ID"])
    return totals, len(kernels)


def ncu_command(ncu: str, log_file: Path, child_args: list[str]) -> list[str]:
    return [ncu, "--clock-control", "none", "--metrics", ",".join(NCU_METRICS), "--csv", "--print-units", "base",
            "--target-processes", "all", "--profile-from-start", "off", "--log-file", str(log_file),
            sys.executable, str(SCRIPT), *child_args]


def measure_hbm_ncu(ncu: str, child_args: list[str], timeout_s: float = 600) -> tuple[float, float, int] | None:
    """(read GB, write GB, kernels) of the child's profiled pass, or None (with the reason printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        log_file = Path(tmp) / "ncu.csv"
        cmd = ncu_command(ncu, log_file, child_args)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=SCRIPT.parents[1])
        except subprocess.TimeoutExpired:
            print(f"  ncu: timed out after {timeout_s:.0f} s: {' '.join(cmd)}", flush=True)
            return None
        text = log_file.read_text() if log_file.exists() else ""
        totals, kernels = parse_ncu_csv(text)
        if kernels == 0:  # some ncu versions print the table to stdout despite --log-file
            totals, kernels = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or kernels == 0:
        tail = "\n    ".join((text + proc.stdout + proc.stderr).strip().splitlines()[-8:])
        print(f"  ncu: no measurement (exit {proc.returncode}, {kernels} kernels); last output:\n    {tail}", flush=True)
        return None
    read_gb, write_gb = totals["dram__bytes_read.sum"] / 1e9, totals["dram__bytes_write.sum"] / 1e9
    print(f"  ncu: {kernels} kernels profiled: {read_gb:.3f} GB read, {write_gb:.3f} GB written", flush=True)
    return read_gb, write_gb, kernels


def forced_forward_blocks(block_m: int | None, block_n: int | None):
    """The kernel's hook for the block-size study: kernels.flash_attention.forced_config("fwd", ...)
    forces the forward's BLOCK_M/BLOCK_N inside a `with` block (None keeps the kernel's choice)."""
    fields = {k: v for k, v in (("BLOCK_M", block_m), ("BLOCK_N", block_n)) if v is not None}
    if not fields:
        return nullcontext()
    module = importlib.import_module("kernels.flash_attention")  # the module (the package exports the function)
    return module.forced_config("fwd", **fields)


def effective_forward_blocks(shape: Shape, block_m: int | None, block_n: int | None) -> tuple[int | None, int | None]:
    """(BLOCK_M, BLOCK_N) the forward will launch with under the forced config, when the kernel
    module exposes its config table; (forced values, or None) otherwise."""
    try:
        import triton

        module = importlib.import_module("kernels.flash_attention")
        with forced_forward_blocks(block_m, block_n):
            cfg = module.kernel_config("fwd", max(16, triton.next_power_of_2(shape.head_dim)), parse_dtype(shape.dtype), shape.causal)
        return cfg.BLOCK_M, cfg.BLOCK_N
    except (AttributeError, TypeError, ImportError):
        return block_m, block_n


def child_main(args: argparse.Namespace) -> None:
    """Under ncu: warm up, then run exactly one profiled pass between cudaProfilerStart/Stop."""
    device = resolve_device(args.device)
    shape = shape_from_args(args)
    attn = make_impl(args.ncu_child)
    grad = args.child_pass == "fwdbwd"
    q, k, v, do = random_inputs(shape.batch, shape.heads, shape.seqlen, shape.head_dim, parse_dtype(shape.dtype), device, requires_grad=grad)
    forward, forward_backward = step_fns(attn, q, k, v, do, shape.causal)
    run = forward_backward if grad else forward
    profiling = device.type == "cuda"  # on CPU the child only checks its own plumbing (tests)
    with forced_forward_blocks(args.child_block_m, args.child_block_n):
        for _ in range(3):  # compile, autotune, allocator warm-up: all outside the profiled range
            run()
        synchronize(device)
        if profiling:
            torch.cuda.profiler.start()
        run()
        synchronize(device)
        if profiling:
            torch.cuda.profiler.stop()


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


def measure_impl(impl: str, shape: Shape, device: torch.device, ncu: str | None, warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    row: dict[str, Any] = {key: None for key in ROW_KEYS}
    row["impl"] = impl
    row["gflops_fwd"], row["gflops_bwd"] = analytic_gflops(impl, shape)

    def measure() -> None:
        attn = make_impl(impl)
        row["gflops_fwd_counted"], row["gflops_bwd_counted"] = counted_gflops(attn, shape, device)
        q, k, v, do = random_inputs(shape.batch, shape.heads, shape.seqlen, shape.head_dim, parse_dtype(shape.dtype), device)
        _, forward_backward = step_fns(attn, q, k, v, do, shape.causal)
        row["runtime_ms"] = bench_ms(forward_backward, device, warmup_ms, rep_ms)

    _, row["status"] = run_guarded(measure, device, impl)
    child = ["--ncu-child", impl, "--child-pass", "fwdbwd", "--device", str(device), *shape.cli()]
    hbm = measure_hbm_ncu(ncu, child) if ncu and row["status"] == "ok" else None
    if hbm is not None:
        row["hbm_read_gb"], row["hbm_write_gb"], _ = hbm
        row["hbm_source"] = "ncu"
    else:
        read, write = analytic_hbm_bytes(impl, shape)
        row["hbm_read_gb"], row["hbm_write_gb"], row["hbm_source"] = read / 1e9, write / 1e9, "analytic"
    return {k: rounded(v) if isinstance(v, float) else v for k, v in row.items()}


def measure_block(shape: Shape, block_m: int | None, block_n: int, device: torch.device, ncu: str | None,
                  warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    """Our forward (no grad) with forced tile sizes: ms, HBM, and the largest difference from the
    output at the kernel's default tiles (a forced config must not change the result)."""
    row: dict[str, Any] = {key: None for key in BLOCK_KEYS}
    row["impl"] = "flash"
    row["block_m"], row["block_n"] = effective_forward_blocks(shape, block_m, block_n)

    def measure() -> None:
        attn = make_impl("flash")
        q, k, v, _ = random_inputs(shape.batch, shape.heads, shape.seqlen, shape.head_dim, parse_dtype(shape.dtype), device, requires_grad=False)
        reference = attn(q, k, v, shape.causal)
        with forced_forward_blocks(block_m, block_n):
            out = attn(q, k, v, shape.causal)
            row["fwd_ms"] = bench_ms(lambda: attn(q, k, v, shape.causal), device, warmup_ms, rep_ms)
        row["max_abs_diff_vs_default"] = (out.float() - reference.float()).abs().max().item()

    label = f"flash fwd BLOCK_M={row['block_m']} BLOCK_N={row['block_n']}"
    _, row["status"] = run_guarded(measure, device, label)
    child = ["--ncu-child", "flash", "--child-pass", "fwd", "--device", str(device), "--child-block-n", str(block_n), *shape.cli()]
    if block_m is not None:
        child += ["--child-block-m", str(block_m)]
    hbm = measure_hbm_ncu(ncu, child) if ncu and row["status"] == "ok" else None
    if hbm is not None:
        row["hbm_read_gb"], row["hbm_write_gb"], _ = hbm
        row["hbm_source"] = "ncu"
    elif row["block_m"] is not None:
        read, write = forward_hbm_bytes(shape, row["block_m"])
        row["hbm_read_gb"], row["hbm_write_gb"], row["hbm_source"] = read / 1e9, write / 1e9, "analytic"
    return {k: rounded(v) if isinstance(v, float) else v for k, v in row.items()}


def _total(row: dict[str, Any], a: str, b: str) -> float | None:
    return None if row[a] is None or row[b] is None else row[a] + row[b]


def markdown(meta: dict[str, Any], shape: Shape, rows: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> str:
    """The paper table beside Figure 2's A100 numbers, the block-size study, and notes."""
    f = lambda x, spec=".1f": "-" if x is None else format(x, spec)  # noqa: E731
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
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(line) + " |" for line in body),
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
        lines += [
            "## Block-size study: our forward at several BLOCK_N (paper Fig. 2, middle)",
            "",
            "| BLOCK_M | BLOCK_N | fwd ms | HBM read / write GB | source | max abs diff vs default tiles | status |",
            "|---|---|---|---|---|---|---|",
            *(f"| {f(b['block_m'], 'd')} | {f(b['block_n'], 'd')} | {f(b['fwd_ms'], '.3f')} | {f(b['hbm_read_gb'], '.3f')} / "
              f"{f(b['hbm_write_gb'], '.3f')} | {b['hbm_source'] or '-'} | {f(b['max_abs_diff_vs_default'], '.2g')} | {b['status']} |" for b in blocks),
            "",
        ]
    return "\n".join(lines)


TABLE = Table([
    ("impl", "impl", 8, ""), ("gflops_fwd", "GF fwd", 8, ".1f"), ("gflops_bwd", "GF bwd", 8, ".1f"),
    ("gflops_fwd_counted", "cnt fwd", 8, ".1f"), ("gflops_bwd_counted", "cnt bwd", 8, ".1f"),
    ("hbm_read_gb", "HBM rd GB", 10, ".3f"), ("hbm_write_gb", "HBM wr GB", 10, ".3f"), ("hbm_source", "source", 9, ""),
    ("runtime_ms", "ms", 9, ".3f"), ("status", "status", 11, ""),
])


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

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
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "paper_table.json", help="the markdown goes beside it (.md)")
    p.add_argument("--ncu-child", choices=IMPL_NAMES, help=argparse.SUPPRESS)  # internal: the run profiled by ncu
    p.add_argument("--child-pass", choices=("fwd", "fwdbwd"), default="fwdbwd", help=argparse.SUPPRESS)
    p.add_argument("--child-block-m", type=int, help=argparse.SUPPRESS)  # the child's forced forward tiles
    p.add_argument("--child-block-n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return fill_defaults(p, args, DEFAULTS, QUICK, dtype_keys=["dtype"])


def shape_from_args(args: argparse.Namespace) -> Shape:
    return Shape(args.batch, args.heads, args.seqlen, args.head_dim, args.dtype, args.causal)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.ncu_child:
        child_main(args)
        return {}
    device = resolve_device(args.device)
    shape = shape_from_args(args)
    ncu = shutil.which("ncu") if args.ncu == "auto" and device.type == "cuda" else None
    meta = run_meta(device, CONVENTION, shape=dataclasses.asdict(shape), hbm_tool=ncu or "analytic model", paper_a100=PAPER_A100)
    print(f"paper table on {meta['gpu']}: {shape}; HBM from {'ncu (' + ncu + ')' if ncu else 'the analytic model'}", flush=True)
    print(TABLE.header(), flush=True)
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
    args.out.with_suffix(".md").write_text(text)
    print("\n" + text, flush=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}", flush=True)
    return {"meta": meta, "rows": rows, "block_study": blocks}


if __name__ == "__main__":
    main()
