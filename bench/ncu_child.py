"""The one pass Nsight Compute profiles (bench/ncu.py runs this under `ncu`).

    python -m bench.ncu_child naive --pass fwdbwd --batch 64 --heads 16 --seqlen 1024 --head-dim 64 --dtype float16 --causal
    python -m bench.ncu_child flash --pass fwd --block-n 32 ...     # our forward at forced tiles

It warms up (compile, autotune, allocator) outside the profiled range, then runs exactly one pass
between cudaProfilerStart and cudaProfilerStop (`ncu --profile-from-start off` counts only that).
On CPU it runs the same calls without a profiler (the tests check its plumbing that way).
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch

from bench.cli import dtype_name, parse_dtype, resolve_device
from bench.impls import IMPL_NAMES, make_impl
from bench.inputs import Shape, step_fns
from bench.tiles import config, forward_at
from bench.timing import synchronize

WARMUP_CALLS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impl", choices=IMPL_NAMES)
    p.add_argument("--pass", dest="pass_", choices=("fwd", "fwdbwd"), default="fwdbwd")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, required=True)
    p.add_argument("--device", help="cuda (default when present) or cpu")
    p.add_argument("--block-m", type=int, help="force our forward's BLOCK_M (flash --pass fwd only)")
    p.add_argument("--block-n", type=int, help="force our forward's BLOCK_N (flash --pass fwd only)")
    args = p.parse_args(argv)
    forced = args.block_m is not None or args.block_n is not None
    if forced and (args.impl != "flash" or args.pass_ != "fwd"):
        p.error("--block-m/--block-n force our forward's tiles: use them with `flash --pass fwd`")
    try:
        args.dtype = dtype_name(parse_dtype(args.dtype))
    except ValueError as err:
        p.error(str(err))
    return args


def shape_of(args: argparse.Namespace) -> Shape:
    return Shape(args.batch, args.heads, args.seqlen, args.head_dim, args.dtype, args.causal)


def profiled_pass(args: argparse.Namespace, device: torch.device) -> Callable[[], object]:
    """The call to profile: our forward at the forced tiles, or `impl`'s forward / forward+backward."""
    shape = shape_of(args)
    grad = args.pass_ == "fwdbwd"
    q, k, v, do = shape.inputs(device, requires_grad=grad)
    if args.block_m is not None or args.block_n is not None:
        cfg = config("fwd", shape.head_dim, parse_dtype(shape.dtype), shape.causal, BLOCK_M=args.block_m, BLOCK_N=args.block_n)
        attn = forward_at(cfg)
    else:
        attn = make_impl(args.impl)
    forward, forward_backward = step_fns(attn, q, k, v, do, shape.causal)
    return forward_backward if grad else forward


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    run = profiled_pass(args, device)
    for _ in range(WARMUP_CALLS):  # compile, autotune, allocator warm-up: all outside the profiled range
        run()
    synchronize(device)
    profiling = device.type == "cuda"
    if profiling:
        torch.cuda.profiler.start()
    run()
    synchronize(device)
    if profiling:
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
