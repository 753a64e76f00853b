"""Analytic HBM traffic of attention forward+backward: what the paper table reports when Nsight
Compute cannot measure it (no `ncu`, or no permission for the GPU's counters)."""

from __future__ import annotations

from bench.flops import MATERIALISING
from bench.inputs import Shape


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
    Ours runs four kernels (forward, preprocess, dK/dV, dQ); flash_fused (and flash_hopper, the same
    schedule in Gluon; its inputs' copies to a contiguous layout are not counted) replaces the last two by one
    that adds dQ into a float32 buffer (zeroed first, atomics assumed to meet in L2, so the buffer
    is read and written back once) and a cast. SDPA's fused backends are modelled as the compulsory
    traffic: q, k, v read and o written forward; q, k, v, o, dO read and dq, dk, dv written backward.
    `nd` is one (B, H, N, d) tensor, `nd32` the same in float32, `stat` one fp32 (B, H, N) row statistic."""
    nd = shape.batch * shape.heads * shape.seqlen * shape.head_dim * shape.elem
    nd32 = shape.batch * shape.heads * shape.seqlen * shape.head_dim * 4
    stat = shape.batch * shape.heads * shape.seqlen * 4
    if impl in ("flash", "flash_two_pass", "flash_portable"):  # flash modelled as the two passes, its schedule off Hopper
        kernels = [  # (reads, writes)
            (3 * nd, nd + stat),                # forward: q, k, v -> o, lse
            (2 * nd, stat),                     # preprocess: o, dO -> delta = rowsum(dO ∘ O)
            (4 * nd + 2 * stat, 2 * nd),        # dK/dV: q, k, v, dO, lse, delta -> dk, dv
            (4 * nd + 2 * stat, nd),            # dQ: q, k, v, dO, lse, delta -> dq
        ]
    elif impl in ("flash_fused", "flash_hopper"):
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
    """(read, write) bytes of `impl`'s forward+backward at `shape`."""
    return naive_hbm_bytes(shape) if impl in MATERIALISING else fused_hbm_bytes(shape, impl)


def forward_hbm_bytes(shape: Shape, block_m: int) -> tuple[float, float]:
    """(read, write) bytes of our forward with BLOCK_M query rows per program, counting every K/V
    tile load as HBM traffic (no L2 reuse, the paper's Theorem 2 accounting): each of the
    ceil(N / BLOCK_M) query blocks streams the keys it can see (about half when causal)."""
    nd = shape.batch * shape.heads * shape.seqlen * shape.head_dim * shape.elem
    blocks = -(-shape.seqlen // block_m)
    kv_passes = (blocks + 1) / 2 if shape.causal else blocks
    return nd + 2 * nd * kv_passes, float(nd + shape.batch * shape.heads * shape.seqlen * 4)
