"""Time our FlashAttention kernels under several launch configs, beside SDPA, on one GPU.

A tuning tool for the config table in kernels/flash_attention.py (not a test): for each
(head_dim, causal) it times the forward under each forward config, the backward under each
dK/dV config and each dQ config (the other kernels at their defaults), checks every variant
against SDPA's output, and prints/writes the best. TFLOP/s use kernels.flops (forward 4·d·pairs,
backward 2.5× forward, pairs exact under the causal mask).

    python scripts/tune_flash.py --out results.json            # bf16, N=8192, d 64 and 128
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
    _bwd_dkdv, _bwd_dq, _bwd_preprocess, _flash_backward, _flash_forward, forced_config, kernel_config,
)
from kernels.flops import attention_flops  # noqa: E402

def grid(block_m: list[int], block_n: list[int], warps: list[int], stages: list[int]) -> list[dict]:
    return [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s) for m, n, w, s in itertools.product(block_m, block_n, warps, stages)]


# dK/dV programs own BLOCK_N keys and stream BLOCK_M queries; dQ programs the other way round
GRIDS = {
    "fwd": grid([64, 128], [64, 128], [4, 8], [3, 4]),
    "bwd_dkdv": grid([32, 64], [64, 128], [4, 8], [2, 3]),
    "bwd_dq": grid([64, 128], [32, 64], [4, 8], [2, 3]),
}


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def tflops(flops: int, ms: float) -> float:
    return flops / ms / 1e9


def tune_shape(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, dtype: torch.dtype, budget_s: float,
               kernels_to_tune: list[str]) -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    scale = head_dim ** -0.5
    fwd_flops = attention_flops(batch, heads, seqlen, seqlen, head_dim, causal, "fwd")
    bwd_flops = int(2.5 * fwd_flops)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
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
    runs = {  # each kernel alone, so its config is judged by its own time
        "fwd": lambda: _flash_forward(q, k, v, causal, scale)[0],
        "bwd_dkdv": lambda: _bwd_dkdv(do, q, k, v, lse, delta, causal, scale)[0],
        "bwd_dq": lambda: _bwd_dq(do, q, k, v, lse, delta, causal, scale),
    }
    reference = {name: fn() for name, fn in runs.items()}
    rows = {name: [] for name in runs}
    for kernel in kernels_to_tune:
        start = time.time()
        for cfg in GRIDS[kernel]:
            if time.time() - start > budget_s:
                break
            try:
                with forced_config(kernel, **cfg):
                    out = runs[kernel]()
                    bad = (out.float() - reference[kernel].float()).abs().max().item() > 0.05 * reference[kernel].float().abs().max().item()
                    ms = bench(runs[kernel])
                rows[kernel].append({**cfg, "ms": ms, "wrong": bad})
            except Exception as exc:  # out of shared memory / registers: record and go on
                rows[kernel].append({**cfg, "ms": None, "error": type(exc).__name__ + ": " + str(exc)[:120]})
        ok = sorted((r for r in rows[kernel] if r.get("ms") and not r.get("wrong")), key=lambda r: r["ms"])
        print(f"  d={head_dim} causal={causal} {kernel}: default {bench(runs[kernel]):.3f} ms; best "
              f"{[(r['BLOCK_M'], r['BLOCK_N'], r['num_warps'], r['num_stages'], round(r['ms'], 3)) for r in ok[:4]]}"
              f" ({len(rows[kernel])} tried, {sum(1 for r in rows[kernel] if r.get('wrong'))} wrong)", flush=True)
    for name in runs:
        result[name] = {"best": sorted((r for r in rows[name] if r.get("ms") and not r.get("wrong")), key=lambda r: r["ms"])[:3]}
    result["default_fwd_ms"] = bench(lambda: _flash_forward(q, k, v, causal, scale))
    result["default_bwd_ms"] = bench(lambda: _flash_backward(do, q, k, v, o, lse, causal, scale))
    result["default_cfg"] = {kname: kernel_config(kname, triton.next_power_of_2(head_dim), dtype, causal).__dict__
                             for kname in ("fwd", "bwd_dkdv", "bwd_dq")}
    result["all"] = rows
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=16384, help="batch × seqlen")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "true", "false"], default="both")
    parser.add_argument("--budget-s", type=float, default=60.0, help="seconds of tuning per shape")
    parser.add_argument("--kernels", nargs="*", default=list(GRIDS), choices=list(GRIDS), help="kernels to tune (none: just time)")
    parser.add_argument("--out", type=Path, default=Path("tune_flash.json"))
    args = parser.parse_args()
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    results = []
    for head_dim in args.head_dims:
        for causal in causals:
            r = tune_shape(args.tokens // args.seqlen, args.heads, args.seqlen, head_dim, causal, torch.bfloat16, args.budget_s, args.kernels)
            results.append(r)
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "triton": triton.__version__, "results": results}, indent=1))
            fwd_flops = attention_flops(r["batch"], r["heads"], r["seqlen"], r["seqlen"], head_dim, causal, "fwd")
            ours_total = tflops(int(3.5 * fwd_flops), r["default_fwd_ms"] + r["default_bwd_ms"])
            print(f"d={head_dim} causal={causal}: sdpa fwd {r['sdpa']['fwd_tflops']:.0f} bwd {r['sdpa']['bwd_tflops']:.0f} "
                  f"total {r['sdpa']['fwdbwd_tflops']:.0f} | sdpa_flash total {r['sdpa_flash']['fwdbwd_tflops']:.0f} | "
                  f"ours (defaults) fwd {tflops(fwd_flops, r['default_fwd_ms']):.0f} bwd {tflops(int(2.5 * fwd_flops), r['default_bwd_ms']):.0f} "
                  f"total {ours_total:.0f} TFLOP/s", flush=True)

if __name__ == "__main__":
    main()
