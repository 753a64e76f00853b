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

from kernels.flash_attention import _flash_backward, _flash_forward, forced_config, kernel_config  # noqa: E402
from kernels.flops import attention_flops  # noqa: E402

FWD_GRID = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
            for m, n, w, s in itertools.product([64, 128], [32, 64, 128], [4, 8], [2, 3, 4])]
DKDV_GRID = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
             for m, n, w, s in itertools.product([16, 32, 64], [64, 128], [4, 8], [2, 3])]
DQ_GRID = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
           for m, n, w, s in itertools.product([64, 128], [16, 32, 64], [4, 8], [2, 3])]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def tflops(flops: int, ms: float) -> float:
    return flops / ms / 1e9


def tune_shape(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, dtype: torch.dtype, budget_s: float) -> dict:
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

    start = time.time()
    rows = {"fwd": [], "bwd_dkdv": [], "bwd_dq": []}
    o, lse = _flash_forward(q, k, v, causal, scale)
    err = (o.float() - ref.float()).abs().max().item()
    result["default_fwd_err_vs_sdpa"] = err
    for kernel, grid in (("fwd", FWD_GRID), ("bwd_dkdv", DKDV_GRID), ("bwd_dq", DQ_GRID)):
        for cfg in grid:
            if time.time() - start > budget_s:
                break
            try:
                with forced_config(kernel, **cfg):
                    if kernel == "fwd":
                        out, _ = _flash_forward(q, k, v, causal, scale)
                        bad = (out.float() - ref.float()).abs().max().item() > 4 * err + 1e-3
                        ms = bench(lambda: _flash_forward(q, k, v, causal, scale))
                    else:
                        ms = bench(lambda: _flash_backward(do, q, k, v, o, lse, causal, scale))
                        bad = False
                rows[kernel].append({**cfg, "ms": ms, "wrong": bad})
            except Exception as exc:  # out of shared memory / registers: record and go on
                rows[kernel].append({**cfg, "ms": None, "error": type(exc).__name__ + ": " + str(exc)[:120]})
        ok = [r for r in rows[kernel] if r.get("ms") and not r.get("wrong")]
        ok.sort(key=lambda r: r["ms"])
        result[kernel] = {"best": ok[:3], "tried": len(rows[kernel])}
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
    parser.add_argument("--out", type=Path, default=Path("tune_flash.json"))
    args = parser.parse_args()
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    results = []
    for head_dim in args.head_dims:
        for causal in causals:
            r = tune_shape(args.tokens // args.seqlen, args.heads, args.seqlen, head_dim, causal, torch.bfloat16, args.budget_s)
            results.append(r)
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "triton": triton.__version__, "results": results}, indent=1))
            best_f = r["fwd"]["best"][0] if r["fwd"]["best"] else {}
            best_b = min((x["ms"] for key in ("bwd_dkdv", "bwd_dq") for x in r[key]["best"]), default=float("nan"))
            fwd_flops = attention_flops(r["batch"], r["heads"], r["seqlen"], r["seqlen"], head_dim, causal, "fwd")
            print(f"d={head_dim} causal={causal}: sdpa fwd {r['sdpa']['fwd_tflops']:.0f} bwd {r['sdpa']['bwd_tflops']:.0f} "
                  f"total {r['sdpa']['fwdbwd_tflops']:.0f} | sdpa_flash total {r['sdpa_flash']['fwdbwd_tflops']:.0f} | "
                  f"ours default fwd {tflops(fwd_flops, r['default_fwd_ms']):.0f} bwd {tflops(int(2.5 * fwd_flops), r['default_bwd_ms']):.0f} | "
                  f"best fwd {best_f.get('ms', float('nan')):.3f} ms {best_f} -> {tflops(fwd_flops, best_f.get('ms', float('nan'))):.0f} TF; "
                  f"best bwd {best_b:.3f} ms -> {tflops(int(2.5 * fwd_flops), best_b):.0f} TF", flush=True)
            for key in ("bwd_dkdv", "bwd_dq"):
                print(f"   {key} best: {[(b['BLOCK_M'], b['BLOCK_N'], b['num_warps'], b['num_stages'], round(b['ms'], 3)) for b in r[key]['best']]}", flush=True)


if __name__ == "__main__":
    main()
