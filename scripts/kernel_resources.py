"""Registers, spills and shared memory of our kernels, compiled for a GPU without one.

Triton compiles a kernel for any CUDA target on any machine (its wheel carries ptxas), so this
reads what ptxas allots each launch config: the numbers behind "register-bound" in
docs/perf-notes.md, from a laptop. Nothing is launched. The arguments are specialised as the
launchers' calls on contiguous tensors are (strides and lengths divisible by 16, head-dim stride 1,
MHA: group 1).

    python scripts/kernel_resources.py                                  # the launch table's 16-bit configs, d 64 and 128
    python scripts/kernel_resources.py --kernels bwd_dkdv --head-dims 64 --tiles 32x128x4x3 64x128x8x3
    python scripts/kernel_resources.py --documents both --causal both   # the document-mask variants beside
    python scripts/kernel_resources.py --kernels fwd bwd_dq --head-dims 64 --documents true --maxnreg 128   # a register cap

The numbers are the installed Triton's (its code generation and its ptxas): to read what the GPU
machine runs, use its Triton version, e.g. `pip install --target /tmp/t36 triton==3.6.0 "numpy<2.4"`
and `PYTHONPATH=/tmp/t36:$PWD python scripts/kernel_resources.py`. Runs with the interpreter off
(TRITON_INTERPRET=0 is set here before Triton loads). Writes
outputs/bench/<date>/kernel_resources/kernel_resources.json unless --out says where.
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret: kernels/__init__ keeps an explicit 0

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bench.results import default_out, run_meta, write_json  # noqa: E402
from bench.tables import Column, Table  # noqa: E402
from bench.tiles import config as tile_config  # noqa: E402
from bench.tiles import parse_tile  # noqa: E402
from kernels.flash_attn import launch  # noqa: E402
from kernels.flash_attn.backward import bwd_dq_kernel, bwd_kv_kernel  # noqa: E402
from kernels.flash_attn.forward import fwd_kernel  # noqa: E402

SCRIPT = "kernel_resources"
KERNELS = {"fwd": fwd_kernel, "bwd_dq": bwd_dq_kernel, "bwd_dkdv": bwd_kv_kernel}
# pointer arguments and their element types; "in" = the inputs' dtype
POINTERS = {"Q": "in", "K": "in", "V": "in", "O": "in", "DO": "in", "DQ": "in", "DK": "in", "DV": "in",
            "LSE": "fp32", "DELTA": "fp32", "DOC": "i32", "DOC_RANGE": "i32"}
CONVENTION = ("regs: registers per thread and spill_bytes: spill stores per thread, from `ptxas -v` on the PTX "
              "Triton generates for the target; shared_bytes: the kernel's shared memory (Triton's metadata). "
              "Arguments specialised as the launchers' calls on contiguous tensors (strides and lengths divisible by 16, "
              "head-dim stride 1, group 1); the dK/dV kernel as the two-pass schedule runs it (no dQ)")
TABLE = Table([
    Column("kernel", "kernel"), Column("head_dim", "d"), Column("tile", "tile"), Column("tma", "TMA"),
    Column("causal", "causal"), Column("documents", "docs"), Column("maxnreg", "cap"), Column("regs", "regs"), Column("spill_bytes", "spill B"),
    Column("shared_bytes", "smem B"),
])


def signature(fn: triton.JITFunction, dtype: str, consts: dict[str, Any]) -> tuple[dict, dict, dict]:
    """(signature, constexpr values, attributes) of fn as the launchers' calls specialise it."""
    sig, values, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name], values[name] = "constexpr", consts[name]
        elif name in POINTERS:
            sig[name] = "*" + (dtype if POINTERS[name] == "in" else POINTERS[name])
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("qk_scale", "softmax_scale"):
            sig[name] = "fp32"
        elif name.startswith("stride") and name.endswith("d"):
            sig[name], values[name] = "constexpr", 1  # Triton specialises an int argument equal to 1
        else:
            sig[name] = "i32"
            if name.startswith("stride") or name.startswith("seqlen"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, values, attrs


def kernel_constants(kernel: str, cfg: launch.KernelConfig, head_dim: int, dtype: torch.dtype, causal: bool,
                     documents: bool) -> dict[str, Any]:
    consts = dict(launch._constants(head_dim, dtype, False, False),
                  BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, REVERSE=cfg.REVERSE, TMA=cfg.TMA,
                  CAUSAL=causal, WINDOW=False, DOCS=documents, COUNT_TILES=False, TILES=None, group=1)
    if not documents:
        consts.update(DOC=None, DOC_RANGE=None)
    if kernel == "bwd_dkdv":  # the two-pass schedule's pass: no dQ to add
        consts.update(ATOMIC_DQ=False, TMA_DQ=False, DQ=None, **{f"stride_dq{s}": None for s in "bhnd"})
    return consts


def ptxas_stats(ptx: str, capability: int) -> tuple[int | None, int | None]:
    """(registers, spill-store bytes) per thread from `ptxas -v`: the ptxas Triton itself uses for
    this target (its wheel carries them), since the PTX version it writes needs a matching one."""
    from triton.backends.nvidia.compiler import get_ptxas

    exe = get_ptxas(capability).path
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([exe, "-v", f"--gpu-name={arch}", str(src), "-o", str(Path(tmp) / "k.o")], capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"ptxas failed: {log[-500:]}")
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return (int(regs.group(1)) if regs else None), (int(spills.group(1)) if spills else 0)


def measure(kernel: str, cfg: launch.KernelConfig, head_dim: int, dtype: torch.dtype, causal: bool, documents: bool,
            capability: int) -> dict[str, Any]:
    fn = KERNELS[kernel]
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    sig, values, attrs = signature(fn, short, kernel_constants(kernel, cfg, head_dim, dtype, causal, documents))
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.maxnreg is not None:
        options["maxnreg"] = cfg.maxnreg
    compiled = triton.compile(ASTSource(fn, sig, values, attrs), target=GPUTarget("cuda", capability, 32), options=options)
    regs, spills = ptxas_stats(compiled.asm["ptx"], capability)
    return dict(kernel=kernel, head_dim=head_dim, dtype=short, causal=causal, documents=documents,
                tile=f"{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.num_warps}x{cfg.num_stages}", tma=cfg.TMA, maxnreg=cfg.maxnreg,
                regs=regs, spill_bytes=spills, shared_bytes=compiled.metadata.shared)


def configs(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, documents: bool, tiles: list[dict],
            maxnreg: list[int]) -> list[launch.KernelConfig]:
    """The launch table's config (the document variant's with its register cap, if any), or the
    table's with each of `tiles` (parse_tile dicts) and each of the `maxnreg` caps put in."""
    caps = [dict(maxnreg=cap) for cap in maxnreg] or [{}]
    return [tile_config(kernel, head_dim, dtype, causal, documents, **tile, **cap) for tile in tiles or [{}] for cap in caps]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--tiles", nargs="+", type=parse_tile, default=[], metavar="MxNxWARPSxSTAGES",
                   help="launch configs to compile, e.g. 64x128x8x3 (default: the launch table's)")
    p.add_argument("--causal", default="true", choices=["true", "false", "both"])
    p.add_argument("--documents", default="false", choices=["true", "false", "both"], help="the document-mask variant")
    p.add_argument("--maxnreg", nargs="+", type=int, default=[], help="register caps per thread to try (default: the table's)")
    p.add_argument("--capability", type=int, default=90, help="CUDA compute capability to compile for (90: H100/H200)")
    p.add_argument("--out", type=Path, help=f"default {default_out(SCRIPT, SCRIPT + '.json')}")
    args = p.parse_args(argv)
    args.out = args.out or default_out(SCRIPT, SCRIPT + ".json")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    both = {"true": [True], "false": [False], "both": [False, True]}
    rows = []
    for kernel, head_dim, causal, documents in itertools.product(args.kernels, args.head_dims, both[args.causal], both[args.documents]):
        for cfg in configs(kernel, head_dim, dtype, causal, documents, args.tiles, args.maxnreg):
            rows.append(measure(kernel, cfg, head_dim, dtype, causal, documents, args.capability))
            print(TABLE.render(rows[-1:]).splitlines()[-1], flush=True)
    print("\n" + TABLE.render(rows))
    meta = run_meta(torch.device("cpu"), CONVENTION, target=f"cuda sm_{args.capability}", timer=None,
                    gpu=f"none needed: compiled for sm_{args.capability}")
    write_json(args.out, {"meta": meta, "rows": rows})
    print(f"\nwrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
