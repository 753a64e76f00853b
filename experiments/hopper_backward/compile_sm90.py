"""Compile every Gluon variant (dkdv.py's dK/dV pass; the single-pass backward that training runs,
kernels/flash_attn/backward_hopper.py, in the configs below) for sm_90
without a GPU and print registers / spills / shared memory (ptxas -v on the generated PTX), ptxas
warnings (e.g. serialized wgmma) and a few instruction counts of the PTX:

    PYTHONPATH=/tmp/t36:$PWD python experiments/hopper_backward/compile_sm90.py [--kernel dkdv|hopper]
        [--only NAME] [--json PATH] [--dump DIR]

Needs triton (3.6.0, the GPU machine's version) and torch (CPU is enough); no GPU. `regs` is ptxas's count for
the whole kernel: with warp specialization it is the launch's per-thread budget (65536 / threads,
rounded down to 8), and `setmaxnreg` shows what the partitions get (consumers / producer).
"""
import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]
os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (kernels/__init__ keeps an explicit 0)

import dkdv  # noqa: E402
import triton  # noqa: E402
from hopper_variants import HOPPER_VARIANTS  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kernels.flash_attn import backward_hopper  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
KERNELS = {
    "dkdv": (dkdv.bwd_dkdv_gluon_kernel, dkdv.VARIANTS),
    "hopper": (backward_hopper.bwd_hopper_kernel, {k: dataclasses.asdict(c) for k, c in HOPPER_VARIANTS.items()}),
}
POINTERS = {"DK": None, "DV": None, "LSE": "fp32", "DELTA": "fp32"}  # None: the input dtype
HOST_KNOBS = {"L2_GROUP_MB"}  # config fields the launcher uses, not the kernel


def _desc(dtype_str, elem, block_shape):
    layout = gl.NVMMASharedLayout.get_default_for(list(block_shape), elem)
    return f"tensordesc<{dtype_str}{list(block_shape)},{layout!r}>"


def compile_variant(kernel: str, name: str, head_dim: int, causal: bool, dtype_str: str = "bf16", window: bool = False):
    """triton.compile of one variant as the launcher would specialize it (16-byte aligned pointers)."""
    fn, variants = KERNELS[kernel]
    cfg = dict(variants[name])
    elem = gl.bfloat16 if dtype_str == "bf16" else gl.float16
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    lead = (1, 1) if cfg.get("STRIDED") else ()  # STRIDED: 4-D boxes over (B, H, N, d)
    descs = {
        "q_desc": _desc(dtype_str, elem, (*lead, bm, head_dim)), "do_desc": _desc(dtype_str, elem, (*lead, bm, head_dim)),
        "k_desc": _desc(dtype_str, elem, (*lead, bn, head_dim)), "v_desc": _desc(dtype_str, elem, (*lead, bn, head_dim)),
        "lse_desc": _desc("fp32", gl.float32, (bm,)), "delta_desc": _desc("fp32", gl.float32, (bm,)),
        "dq_desc": _desc("fp32", gl.float32, (bm, head_dim)),
    }
    constexprs = {k: v for k, v in cfg.items() if k not in HOST_KNOBS}
    constexprs.update(HEAD_DIM=head_dim, CAUSAL=causal)
    if "WINDOW" in fn.arg_names:
        constexprs["WINDOW"] = window
    sig, attrs = {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            sig[arg] = "constexpr"
        elif arg in descs:
            sig[arg] = descs[arg]
        elif arg in POINTERS:
            sig[arg] = f"*{POINTERS[arg] or dtype_str}"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif arg in ("qk_scale", "softmax_scale"):
            sig[arg] = "fp32"
        else:
            sig[arg] = "i32"
    missing = set(constexprs) - set(sig)
    assert not missing, f"variant knobs the kernel lacks: {missing}"
    src = GluonASTSource(fn, sig, {k: constexprs[k] for k in sig if sig[k] == "constexpr"}, attrs)
    t0 = time.time()
    ck = triton.compile(src, target=TARGET, options={"num_warps": cfg["num_warps"]})
    return ck, time.time() - t0


def ptxas_stats(ptx: str) -> dict:
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(d, "k.o")],
                             capture_output=True, text=True)
    log = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill_st = re.search(r"(\d+) bytes spill stores", log)
    spill_ld = re.search(r"(\d+) bytes spill loads", log)
    warnings = [ln.strip() for ln in log.splitlines() if "warning" in ln.lower() or "Performance" in ln]
    return dict(regs=int(regs.group(1)) if regs else None,
                spill_stores=int(spill_st.group(1)) if spill_st else None,
                spill_loads=int(spill_ld.group(1)) if spill_ld else None,
                ptxas_ok=out.returncode == 0, ptxas_warnings=warnings)


def ptx_counts(ptx: str) -> dict:
    """Static counts of a few instructions (not per tile: unrolled / duplicated code counts each copy)."""
    return dict(
        wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
        wgmma_waits=len(re.findall(r"wgmma\.wait_group", ptx)),
        bar_sync=len(re.findall(r"\bbar\.sync|\bbarrier\.sync", ptx)),
        tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        tma_reduce=len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
        bulk_wait=len(re.findall(r"cp\.async\.bulk\.wait_group", ptx)),
        atomics=len(re.findall(r"\bred\.|\batom\.", ptx)),
        setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)), key=int),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=list(KERNELS), help="one kernel's variants (default: both)")
    ap.add_argument("--only", help="comma-separated variant names")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--json", help="write the stats here")
    ap.add_argument("--window", action="store_true", help="the sliding-window build (WINDOW; causal folded into it)")
    ap.add_argument("--dump", help="write ttgir / ptx per variant here")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, target {TARGET}")
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for kernel, (_, variants) in KERNELS.items():
        if args.kernel and kernel != args.kernel:
            continue
        for name, cfg in variants.items():
            if only and name not in only:
                continue
            for d in map(int, args.head_dims.split(",")):
                for causal in (False,) if args.window else (False, True):
                    rec = dict(kernel=kernel, variant=name, head_dim=d, causal=causal, window=args.window, dtype=args.dtype,
                               **cfg)
                    try:
                        ck, secs = compile_variant(kernel, name, d, causal, args.dtype, args.window)
                        ptx = ck.asm["ptx"]
                        rec.update(ok=True, compile_s=round(secs, 1), shared=ck.metadata.shared,
                                   num_warps_total=ck.metadata.num_warps, **ptxas_stats(ptx), **ptx_counts(ptx))
                        if args.dump:
                            os.makedirs(args.dump, exist_ok=True)
                            mask = "window" if args.window else "causal" if causal else "full"
                            stem = os.path.join(args.dump, f"{name}_d{d}_{mask}")
                            for ext in ("ttgir", "ptx"):
                                with open(f"{stem}.{ext}", "w") as f:
                                    f.write(ck.asm[ext])
                    except Exception as e:  # noqa: BLE001
                        rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[-3000:]}")
                    rows.append(rec)
                    head = f"{name:28s} d={d:3d} {'window' if args.window else 'causal' if causal else 'full  '}"
                    if rec["ok"]:
                        print(f"{head} warps={rec['num_warps_total']:2d} regs={rec['regs']} setmaxnreg={rec['setmaxnreg']} "
                              f"spills={rec['spill_stores']}/{rec['spill_loads']} smem={rec['shared']} "
                              f"wgmma={rec['wgmma']} bar.sync={rec['bar_sync']} tma_reduce={rec['tma_reduce']} "
                              f"atomics={rec['atomics']} ({rec['compile_s']}s) {'; '.join(rec['ptxas_warnings'])[:300]}",
                              flush=True)
                    else:
                        print(f"{head} FAILED: {rec['error'][-1500:]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} compiled")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
