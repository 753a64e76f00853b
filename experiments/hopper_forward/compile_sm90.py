"""Compile the Gluon forward (kernels/flash_attn/forward_hopper.py) for sm_90 without a GPU and print
ptxas's registers / spills, shared memory and a few PTX counts per (head_dim, causal, STRIDED,
STAGES, CONSUMER_REGS), as the launcher would specialize it:

    PYTHONPATH=/tmp/t36:$PWD python experiments/hopper_forward/compile_sm90.py [--regs 240 200] [--dump DIR]

Needs triton 3.6.0 (the H200's) and torch (CPU is enough). The statistics helpers are
experiments/hopper_backward/compile_sm90.py's.
"""
import argparse
import itertools
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "experiments", "hopper_backward"), ROOT]
os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret

import compile_sm90 as stats  # noqa: E402
import triton  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kernels.flash_attn import forward_hopper  # noqa: E402


def compile_forward(head_dim: int, causal: bool, strided: bool, stages: int, regs: int, block_n: int = 128,
                    consumers: int = 2, window: bool = False):
    lead = (1, 1) if strided else ()  # STRIDED: 4-D boxes over (B, H, N, d)
    rows = forward_hopper.ROWS_PER_WARPGROUP
    descs = {"q_desc": stats._desc("bf16", gl.bfloat16, (*lead, rows, head_dim)),
             "k_desc": stats._desc("bf16", gl.bfloat16, (*lead, block_n, head_dim)),
             "v_desc": stats._desc("bf16", gl.bfloat16, (*lead, block_n, head_dim))}
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, STRIDED=strided,
                      CONSUMERS=consumers, CONSUMER_REGS=regs)
    if "WINDOW" in forward_hopper.fwd_hopper_kernel.arg_names:
        constexprs["WINDOW"] = window
    sig, attrs = {}, {}
    for i, arg in enumerate(forward_hopper.fwd_hopper_kernel.arg_names):
        if arg in constexprs:
            sig[arg] = "constexpr"
        elif arg in descs:
            sig[arg] = descs[arg]
        elif arg in ("OUT", "LSE"):
            sig[arg] = "*bf16" if arg == "OUT" else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[arg] = "fp32" if arg == "qk_scale" else "i32"
    src = GluonASTSource(forward_hopper.fwd_hopper_kernel, sig, constexprs, attrs)
    return triton.compile(src, target=stats.TARGET, options={"num_warps": 4})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regs", type=int, nargs="+", default=[240], help="CONSUMER_REGS values")
    ap.add_argument("--consumers", type=int, default=2, choices=[2, 3], help="consumer warpgroups (CONSUMERS)")
    ap.add_argument("--window", action="store_true", help="the sliding-window build (WINDOW; causal folded into it)")
    ap.add_argument("--dump", help="write ttgir / ptx per config here")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, target {stats.TARGET}")
    causals = (False,) if args.window else (False, True)  # under a window, causal is its right bound
    for d, causal, strided, regs in itertools.product((64, 128), causals, (False, True), args.regs):
        if args.consumers == 3 and d == 128:
            continue  # 192 rows of d=128 accumulators do not fit the register file
        stages = 2 if d == 128 else 3  # 3 stages at d=128 would need 224 KB of shared memory
        for st in sorted({2, stages}):
            t0 = time.time()
            ck = compile_forward(d, causal, strided, st, regs, consumers=args.consumers, window=args.window)
            ptx = ck.asm["ptx"]
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                tag = f"d{d}_{'causal' if causal else 'full'}_{'strided' if strided else 'flat'}_s{st}_r{regs}"
                tag += "" if args.consumers == 2 else f"_wg{args.consumers}"
                tag += "_window" if args.window else ""
                for ext in ("ptx", "ttgir"):
                    with open(os.path.join(args.dump, f"{tag}.{ext}"), "w") as f:
                        f.write(ck.asm[ext])
            print(f"d={d} causal={causal} window={args.window} strided={strided} STAGES={st} CONSUMERS={args.consumers} CONSUMER_REGS={regs}: "
                  f"{time.time() - t0:.1f}s "
                  f"smem={ck.metadata.shared} {stats.ptxas_stats(ptx)} {stats.ptx_counts(ptx)}", flush=True)


if __name__ == "__main__":
    main()
