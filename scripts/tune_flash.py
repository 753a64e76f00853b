"""Time our FlashAttention kernels under several launch configs, beside SDPA, on one GPU.

A tuning tool for the config table in kernels/flash_attn/launch.py (not a test): for each
(head_dim, causal) it times the forward under each forward config, the backward under each
dK/dV config and each dQ config (the other kernels at their defaults), checks every variant
against the default config's output, and prints/writes the best. `--kernels bwd_fused` tunes the
single-pass backward (deterministic=False): each config is timed as a whole backward (preprocess,
dQ zeroing, the fused kernel, dQ cast), checked against SDPA's gradients, and set beside the
two-pass backward. Under the causal mask every kernel's default config is also timed with its
program order flipped (KernelConfig.REVERSE). TFLOP/s use kernels.flops (forward 4·d·pairs, backward 2.5×
forward, pairs exact under the causal mask). Configs are passed to the launchers (`config=`).

    python scripts/tune_flash.py                                # bf16, N=8192, d 64 and 128, two-pass kernels
    python scripts/tune_flash.py --kernels bwd_fused --head-dims 64 --out docs/results/tune_bwd_fused.json
    python scripts/tune_flash.py --kernels bwd_dq --knobs TMA --tiles 128x64x8x3 64x64x4x3   # chosen tiles, TMA on and off
    python scripts/tune_flash.py --device cpu --seqlen 32 --tokens 32 --heads 1 --head-dims 16   # interpreter smoke run

Writes outputs/bench/<date>/tune_flash/tune_flash.json unless --out says where.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.cli import CAUSAL_CHOICES, resolve_device
from bench.results import default_out, run_meta, write_json
from bench.tiles import config, kernel_calls, parse_tile
from bench.timing import bench_ms
from kernels.flash_attn import launch
from kernels.flops import attention_flops

SCRIPT = "tune_flash"
CONVENTION = ("ms: median of triton.testing.do_bench (warm-up 25 ms, 100 ms of repetitions) per call; "
              "TFLOP/s: forward 4*d*pairs, backward 2.5x forward (kernels.flops); fwd/bwd_dkdv/bwd_dq timed alone, "
              "bwd_fused as a whole backward (preprocess, dQ zeroing, fused kernel, dQ cast)")
TILE_FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def grid(block_m: list[int], block_n: list[int], warps: list[int], stages: list[int]) -> list[dict]:
    return [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s) for m, n, w, s in itertools.product(block_m, block_n, warps, stages)]


# dK/dV programs own BLOCK_N keys and stream BLOCK_M queries; dQ programs the other way round;
# fused programs are dK/dV programs that also add dQ (larger BLOCK_N: fewer atomic adds per dQ element)
GRIDS = {
    "fwd": grid([64, 128], [64, 128], [4, 8], [3, 4]),
    "bwd_dkdv": grid([32, 64], [64, 128], [4, 8], [2, 3, 4]),
    "bwd_dq": grid([64, 128], [32, 64], [4, 8], [2, 3, 4]),
    "bwd_fused": grid([64, 32], [128, 64], [8, 4], [2, 3]),
}
KNOBS = ("TMA", "REVERSE")  # boolean KernelConfig fields --knobs can cross the grid with
DEFAULT_KERNELS = ["fwd", "bwd_dkdv", "bwd_dq"]  # bwd_fused on request


def with_knobs(configs: list[dict], knobs: list[str], first: dict) -> list[dict]:
    """`configs` crossed with every on/off setting of `knobs`; the tile of `first` (the default
    config) leads, so a time budget that runs out still covers it under every setting."""
    lead = [c for c in configs if all(c[key] == first[key] for key in c)]
    ordered = lead + [c for c in configs if c not in lead]
    return [{**c, **dict(zip(knobs, values))} for c in ordered for values in itertools.product([False, True], repeat=len(knobs))]


def tflops(flops: int, ms: float) -> float:
    return flops / ms / 1e9


def mismatch(out, ref) -> float:
    """Worst max|out − ref| / max|ref| over the tensors of `out` (one tensor or a tuple)."""
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    return max(((o.float() - r.float()).abs().max() / r.float().abs().max().clamp(min=1e-30)).item() for o, r in zip(outs, refs))


def cfg_tuple(r: dict) -> tuple:
    knobs = tuple(key for key in KNOBS if r.get(key))  # the knobs switched on, by name
    return (r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"], *knobs, round(r["ms"], 3))


def best(rows: list[dict], n: int | None = None) -> list[dict]:
    """The right and measured variants, fastest first."""
    return sorted((r for r in rows if r.get("ms") and not r.get("wrong")), key=lambda r: r["ms"])[:n]


def sdpa_times(q, k, v, do, causal: bool, fwd_flops: int, bwd_flops: int, bench) -> dict:
    """SDPA's default backend (cuDNN on torch 2.11 / H100+) and its flash backend, for scale."""
    result = {}
    for name, backend in (("sdpa", None), ("sdpa_flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION)):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        ctx = torch.nn.attention.sdpa_kernel(backend) if backend is not None else torch.enable_grad()
        with ctx:
            f_ms = bench(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal))
            fb_ms = bench(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do))
        result[name] = {"fwd_ms": f_ms, "bwd_ms": fb_ms - f_ms, "fwd_tflops": tflops(fwd_flops, f_ms),
                        "bwd_tflops": tflops(bwd_flops, fb_ms - f_ms), "fwdbwd_tflops": tflops(fwd_flops + bwd_flops, fb_ms)}
    return result


def tune_shape(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, dtype: torch.dtype, budget_s: float,
               kernels_to_tune: list[str], device: torch.device = torch.device("cuda"), knobs: list[str] = (),
               tiles: list[dict] | None = None) -> dict:
    def bench(fn) -> float:
        return bench_ms(fn, device, warmup_ms=25, rep_ms=100)

    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seqlen, head_dim, device=device, dtype=dtype) for _ in range(4))
    scale = head_dim ** -0.5
    fwd_flops = attention_flops(batch, heads, seqlen, seqlen, head_dim, causal, "fwd")
    bwd_flops = int(2.5 * fwd_flops)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    ref_grads = torch.autograd.grad(ref, (qg, kg, vg), do)  # what the fused backward's variants are checked against
    ref = ref.detach()
    result = {"batch": batch, "heads": heads, "seqlen": seqlen, "head_dim": head_dim, "causal": causal, "dtype": str(dtype)}
    result.update(sdpa_times(q, k, v, do, causal, fwd_flops, bwd_flops, bench))

    def table(kernel: str, **fields) -> launch.KernelConfig:
        return config(kernel, head_dim, dtype, causal, **fields)

    o, lse = launch.forward(q, k, v, causal, scale)
    result["default_fwd_err_vs_sdpa"] = (o.float() - ref.float()).abs().max().item()
    runs = kernel_calls(q, k, v, do, causal)  # each two-pass kernel alone, so its config is judged by its own time
    # a variant is wrong when it is more than 5% of the largest value off: the default config's
    # output for the two-pass kernels, SDPA's dQ, dK, dV for the fused backward
    reference = {name: run(None) for name, run in runs.items() if name != "bwd_fused"}
    reference["bwd_fused"] = ref_grads
    result["default_bwd_err_vs_sdpa"] = mismatch(launch.backward(do, q, k, v, o, lse, causal, scale), ref_grads)
    result["default_bwd_fused_err_vs_sdpa"] = mismatch(runs["bwd_fused"](None), ref_grads)
    rows = {name: [] for name in runs}
    for kernel in kernels_to_tune:
        start = time.time()
        default = table(kernel)
        for fields in with_knobs(tiles or GRIDS[kernel], list(knobs), {key: getattr(default, key) for key in TILE_FIELDS}):
            if time.time() - start > budget_s:
                break
            try:
                cfg = table(kernel, **fields)
                err = mismatch(runs[kernel](cfg), reference[kernel])
                rows[kernel].append({**fields, "ms": bench(lambda: runs[kernel](cfg)), "err": err, "wrong": err > 0.05})
            except Exception as exc:  # out of shared memory / registers: record and go on
                rows[kernel].append({**fields, "ms": None, "error": type(exc).__name__ + ": " + str(exc)[:120]})
        print(f"  d={head_dim} causal={causal} {kernel}: default {bench(lambda: runs[kernel](None)):.3f} ms; best "
              f"{[cfg_tuple(r) for r in best(rows[kernel], 4)]}"
              f" ({len(rows[kernel])} tried, {sum(1 for r in rows[kernel] if r.get('wrong'))} wrong)", flush=True)
    orders = {}
    for kernel in launch.KERNELS if causal else ():  # longest programs first or not: each default config with REVERSE flipped
        default = table(kernel)
        flipped = dataclasses.replace(default, REVERSE=not default.REVERSE)
        orders[kernel] = {f"REVERSE={cfg.REVERSE}": bench(lambda: runs[kernel](cfg)) for cfg in (default, flipped)}
        print(f"  d={head_dim} causal={causal} {kernel} program order: "
              f"{', '.join(f'{key} {ms:.3f} ms' for key, ms in orders[kernel].items())}", flush=True)
    for name in runs:
        result[name] = {"best": best(rows[name], 3)}
    result["program_order_ms"] = orders
    result["default_fwd_ms"] = bench(lambda: launch.forward(q, k, v, causal, scale))
    result["default_bwd_ms"] = bench(lambda: launch.backward(do, q, k, v, o, lse, causal, scale))
    result["default_bwd_fused_ms"] = bench(lambda: runs["bwd_fused"](None))
    result["default_cfg"] = {name: dataclasses.asdict(table(name)) for name in launch.KERNELS}
    result["all"] = rows
    return result


def summary_lines(r: dict) -> list[str]:
    """Ours (table defaults, and the fused backward's best) beside SDPA, in TFLOP/s."""
    d, causal = r["head_dim"], r["causal"]
    fwd_flops = attention_flops(r["batch"], r["heads"], r["seqlen"], r["seqlen"], d, causal, "fwd")
    bwd_flops = int(2.5 * fwd_flops)
    lines = [f"d={d} causal={causal}: sdpa fwd {r['sdpa']['fwd_tflops']:.0f} bwd {r['sdpa']['bwd_tflops']:.0f} "
             f"total {r['sdpa']['fwdbwd_tflops']:.0f} | sdpa_flash total {r['sdpa_flash']['fwdbwd_tflops']:.0f} | "
             f"ours (defaults) fwd {tflops(fwd_flops, r['default_fwd_ms']):.0f} bwd {tflops(bwd_flops, r['default_bwd_ms']):.0f} "
             f"total {tflops(fwd_flops + bwd_flops, r['default_fwd_ms'] + r['default_bwd_ms']):.0f} | "
             f"ours fused bwd {tflops(bwd_flops, r['default_bwd_fused_ms']):.0f} "
             f"total {tflops(fwd_flops + bwd_flops, r['default_fwd_ms'] + r['default_bwd_fused_ms']):.0f} TFLOP/s"]
    if r["bwd_fused"]["best"]:  # the fused backward's best config against the two-pass backward, whole backward each
        b = r["bwd_fused"]["best"][0]
        lines.append(f"d={d} causal={causal}: fused backward best {cfg_tuple(b)} = {tflops(bwd_flops, b['ms']):.0f} TFLOP/s, "
                     f"{r['default_bwd_ms'] / b['ms']:.2f}x the two-pass backward ({r['default_bwd_ms']:.3f} ms); "
                     f"fwd+bwd {tflops(fwd_flops + bwd_flops, r['default_fwd_ms'] + b['ms']):.0f} vs sdpa "
                     f"{r['sdpa']['fwdbwd_tflops']:.0f} TFLOP/s")
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=16384, help="batch × seqlen")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=CAUSAL_CHOICES, default="both")
    parser.add_argument("--budget-s", type=float, default=60.0, help="seconds of tuning per shape")
    parser.add_argument("--kernels", nargs="*", default=DEFAULT_KERNELS, choices=list(GRIDS),
                        help=f"kernels to tune (default {' '.join(DEFAULT_KERNELS)}; none: just time)")
    parser.add_argument("--knobs", nargs="*", default=[], choices=list(KNOBS),
                        help="also try each grid config with these KernelConfig switches on and off")
    parser.add_argument("--tiles", nargs="+", type=parse_tile, metavar="MxNxWARPSxSTAGES",
                        help="try these launch configs instead of the kernel's grid, e.g. 64x128x8x3")
    parser.add_argument("--out", type=Path, help=f"result JSON (default {default_out(SCRIPT, 'tune_flash.json')})")
    parser.add_argument("--device", help="cuda (default when present) or cpu (a smoke run in the Triton interpreter)")
    args = parser.parse_args(argv)
    out = args.out or default_out(SCRIPT, "tune_flash.json")
    device = resolve_device(args.device)
    meta = run_meta(device, CONVENTION)
    results = []
    for head_dim in args.head_dims:
        for causal in CAUSAL_CHOICES[args.causal]:
            results.append(tune_shape(max(1, args.tokens // args.seqlen), args.heads, args.seqlen, head_dim, causal, torch.bfloat16,
                                      args.budget_s, args.kernels, device, args.knobs, args.tiles))
            write_json(out, {**meta, "results": results})
            print("\n".join(summary_lines(results[-1])), flush=True)
    print(f"wrote {out}", flush=True)
    return results


if __name__ == "__main__":
    main()
