"""Time our FlashAttention kernels under several launch configs, beside SDPA, on one GPU.

A tuning tool for the config table in kernels/flash_attention.py (not a test): for each
(head_dim, causal) it times the forward under each forward config, the backward under each
dK/dV config and each dQ config (the other kernels at their defaults), checks every variant
against the default config's output, and prints/writes the best. `--kernels bwd_fused` tunes the
single-pass backward (deterministic=False): each config is timed as a whole backward (preprocess,
dQ zeroing, the fused kernel, dQ cast), checked against SDPA's gradients, and set beside the
two-pass backward. Under the causal mask every kernel's default config is also timed with its
program order flipped (KernelConfig.REVERSE). TFLOP/s use kernels.flops (forward 4·d·pairs, backward 2.5×
forward, pairs exact under the causal mask).

    python scripts/tune_flash.py --out results.json            # bf16, N=8192, d 64 and 128, two-pass kernels
    python scripts/tune_flash.py --kernels bwd_fused --head-dims 64 --out fused64.json
    python scripts/tune_flash.py --device cpu --seqlen 32 --tokens 32 --heads 1 --head-dims 16   # interpreter smoke run
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402  (first: picks the Triton backend before torch.compile imports triton)
import torch  # noqa: E402
import triton  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.flash_attention import (  # noqa: E402
    KERNELS, _bwd_dkdv, _bwd_dq, _bwd_preprocess, _flash_backward, _flash_forward, forced_config, kernel_config,
)
from kernels.flops import attention_flops  # noqa: E402
from scripts._common import bench_ms, resolve_device, run_meta  # noqa: E402

CONVENTION = ("ms: median of triton.testing.do_bench (warm-up 25 ms, 100 ms of repetitions) per call; "
              "TFLOP/s: forward 4*d*pairs, backward 2.5x forward (kernels.flops); fwd/bwd_dkdv/bwd_dq timed alone, "
              "bwd_fused as a whole backward (preprocess, dQ zeroing, fused kernel, dQ cast)")


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


def with_knobs(configs: list[dict], knobs: list[str], first: dict) -> list[dict]:
    """`configs` crossed with every on/off setting of `knobs`; the tile of `first` (the default
    config) leads, so a time budget that runs out still covers it under every setting."""
    lead = [c for c in configs if all(c[key] == first[key] for key in c)]
    ordered = lead + [c for c in configs if c not in lead]
    return [{**c, **dict(zip(knobs, values))} for c in ordered for values in itertools.product([False, True], repeat=len(knobs))]
DEFAULT_KERNELS = ["fwd", "bwd_dkdv", "bwd_dq"]  # bwd_fused on request


def parse_tile(text: str) -> dict:
    """'64x128x8x3' -> BLOCK_M 64, BLOCK_N 128, 8 warps, 3 stages."""
    try:
        block_m, block_n, warps, stages = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"tile {text!r}: write BLOCK_MxBLOCK_NxWARPSxSTAGES, e.g. 64x128x8x3") from None
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)


def tflops(flops: int, ms: float) -> float:
    return flops / ms / 1e9


def mismatch(out, ref) -> float:
    """Worst max|out − ref| / max|ref| over the tensors of `out` (one tensor or a tuple)."""
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    return max(((o.float() - r.float()).abs().max() / r.float().abs().max().clamp(min=1e-30)).item() for o, r in zip(outs, refs))


def cfg_tuple(r: dict) -> tuple:
    knobs = tuple(key for key in KNOBS if r.get(key))  # the knobs switched on, by name
    return (r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"], *knobs, round(r["ms"], 3))


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

    # SDPA default (cuDNN on torch 2.11 / H100+) and its flash backend
    for name, backend in (("sdpa", None), ("sdpa_flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION)):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        ctx = torch.nn.attention.sdpa_kernel(backend) if backend is not None else torch.enable_grad()
        with ctx:
            f_ms = bench(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal))
            fb_ms = bench(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do))
        result[name] = {"fwd_ms": f_ms, "bwd_ms": fb_ms - f_ms, "fwd_tflops": tflops(fwd_flops, f_ms),
                        "bwd_tflops": tflops(bwd_flops, fb_ms - f_ms), "fwdbwd_tflops": tflops(fwd_flops + bwd_flops, fb_ms)}

    o, lse = _flash_forward(q, k, v, causal, scale)
    delta = _bwd_preprocess(o, do, lse)
    err = (o.float() - ref.float()).abs().max().item()
    result["default_fwd_err_vs_sdpa"] = err
    runs = {  # each two-pass kernel alone, so its config is judged by its own time
        "fwd": lambda: _flash_forward(q, k, v, causal, scale)[0],
        "bwd_dkdv": lambda: _bwd_dkdv(do, q, k, v, lse, delta, causal, scale)[0],
        "bwd_dq": lambda: _bwd_dq(do, q, k, v, lse, delta, causal, scale),
        # the fused kernel replaces a whole backward: time it as one (preprocess, dQ zeroing and cast included)
        "bwd_fused": lambda: _flash_backward(do, q, k, v, o, lse, causal, scale, deterministic=False),
    }
    # a variant is wrong when it is more than 5% of the largest value off: the default config's
    # output for the two-pass kernels, SDPA's dQ, dK, dV for the fused backward
    reference = {name: fn() for name, fn in runs.items() if name != "bwd_fused"}
    reference["bwd_fused"] = ref_grads
    result["default_bwd_err_vs_sdpa"] = mismatch(_flash_backward(do, q, k, v, o, lse, causal, scale), ref_grads)
    result["default_bwd_fused_err_vs_sdpa"] = mismatch(runs["bwd_fused"](), ref_grads)
    rows = {name: [] for name in runs}
    orders = {}
    for kernel in kernels_to_tune:
        start = time.time()
        default_cfg = kernel_config(kernel, triton.next_power_of_2(head_dim), dtype, causal)
        tile = {key: getattr(default_cfg, key) for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
        for cfg in with_knobs(tiles or GRIDS[kernel], list(knobs), tile):
            if time.time() - start > budget_s:
                break
            try:
                with forced_config(kernel, **cfg):
                    err = mismatch(runs[kernel](), reference[kernel])
                    ms = bench(runs[kernel])
                rows[kernel].append({**cfg, "ms": ms, "err": err, "wrong": err > 0.05})
            except Exception as exc:  # out of shared memory / registers: record and go on
                rows[kernel].append({**cfg, "ms": None, "error": type(exc).__name__ + ": " + str(exc)[:120]})
        ok = sorted((r for r in rows[kernel] if r.get("ms") and not r.get("wrong")), key=lambda r: r["ms"])
        print(f"  d={head_dim} causal={causal} {kernel}: default {bench(runs[kernel]):.3f} ms; best "
              f"{[cfg_tuple(r) for r in ok[:4]]}"
              f" ({len(rows[kernel])} tried, {sum(1 for r in rows[kernel] if r.get('wrong'))} wrong)", flush=True)
    for kernel in KERNELS if causal else ():  # longest programs first or not: each default config with REVERSE flipped
        default_reverse = kernel_config(kernel, triton.next_power_of_2(head_dim), dtype, causal).REVERSE
        default_ms = bench(runs[kernel])
        with forced_config(kernel, REVERSE=not default_reverse):
            flipped_ms = bench(runs[kernel])
        orders[kernel] = {f"REVERSE={default_reverse}": default_ms, f"REVERSE={not default_reverse}": flipped_ms}
        print(f"  d={head_dim} causal={causal} {kernel} program order: "
              f"{', '.join(f'{key} {ms:.3f} ms' for key, ms in orders[kernel].items())}", flush=True)
    for name in runs:
        result[name] = {"best": sorted((r for r in rows[name] if r.get("ms") and not r.get("wrong")), key=lambda r: r["ms"])[:3]}
    result["program_order_ms"] = orders
    result["default_fwd_ms"] = bench(lambda: _flash_forward(q, k, v, causal, scale))
    result["default_bwd_ms"] = bench(lambda: _flash_backward(do, q, k, v, o, lse, causal, scale))
    result["default_bwd_fused_ms"] = bench(runs["bwd_fused"])
    result["default_cfg"] = {kname: kernel_config(kname, triton.next_power_of_2(head_dim), dtype, causal).__dict__
                             for kname in KERNELS}
    result["all"] = rows
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=16384, help="batch × seqlen")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "true", "false"], default="both")
    parser.add_argument("--budget-s", type=float, default=60.0, help="seconds of tuning per shape")
    parser.add_argument("--kernels", nargs="*", default=DEFAULT_KERNELS, choices=list(GRIDS),
                        help=f"kernels to tune (default {' '.join(DEFAULT_KERNELS)}; none: just time)")
    parser.add_argument("--knobs", nargs="*", default=[], choices=list(KNOBS),
                        help="also try each grid config with these KernelConfig switches on and off")
    parser.add_argument("--tiles", nargs="+", type=parse_tile, metavar="MxNxWARPSxSTAGES",
                        help="try these launch configs instead of the kernel's grid, e.g. 64x128x8x3")
    parser.add_argument("--out", type=Path, default=Path("tune_flash.json"))
    parser.add_argument("--device", help="cuda (default when present) or cpu (a smoke run in the Triton interpreter)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    meta = run_meta(device, CONVENTION)
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    results = []
    for head_dim in args.head_dims:
        for causal in causals:
            r = tune_shape(max(1, args.tokens // args.seqlen), args.heads, args.seqlen, head_dim, causal, torch.bfloat16, args.budget_s,
                           args.kernels, device, args.knobs, args.tiles)
            results.append(r)
            args.out.write_text(json.dumps({**meta, "results": results}, indent=1))
            fwd_flops = attention_flops(r["batch"], r["heads"], r["seqlen"], r["seqlen"], head_dim, causal, "fwd")
            bwd_flops = int(2.5 * fwd_flops)
            ours_total = tflops(fwd_flops + bwd_flops, r["default_fwd_ms"] + r["default_bwd_ms"])
            fused_total = tflops(fwd_flops + bwd_flops, r["default_fwd_ms"] + r["default_bwd_fused_ms"])
            print(f"d={head_dim} causal={causal}: sdpa fwd {r['sdpa']['fwd_tflops']:.0f} bwd {r['sdpa']['bwd_tflops']:.0f} "
                  f"total {r['sdpa']['fwdbwd_tflops']:.0f} | sdpa_flash total {r['sdpa_flash']['fwdbwd_tflops']:.0f} | "
                  f"ours (defaults) fwd {tflops(fwd_flops, r['default_fwd_ms']):.0f} bwd {tflops(bwd_flops, r['default_bwd_ms']):.0f} "
                  f"total {ours_total:.0f} | ours fused bwd {tflops(bwd_flops, r['default_bwd_fused_ms']):.0f} "
                  f"total {fused_total:.0f} TFLOP/s", flush=True)
            best_fused = r["bwd_fused"]["best"]
            if best_fused:  # the fused backward's best config against the two-pass backward, whole backward each
                b = best_fused[0]
                print(f"d={head_dim} causal={causal}: fused backward best {cfg_tuple(b)} = {tflops(bwd_flops, b['ms']):.0f} TFLOP/s, "
                      f"{r['default_bwd_ms'] / b['ms']:.2f}x the two-pass backward ({r['default_bwd_ms']:.3f} ms); "
                      f"fwd+bwd {tflops(fwd_flops + bwd_flops, r['default_fwd_ms'] + b['ms']):.0f} vs sdpa "
                      f"{r['sdpa']['fwdbwd_tflops']:.0f} TFLOP/s", flush=True)
    return results


if __name__ == "__main__":
    main()
