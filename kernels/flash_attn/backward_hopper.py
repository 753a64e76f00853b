"""The Hopper fast path for the backward: a single-pass (FlashAttention-3) kernel in Gluon.

What runs where. `launch.backward(schedule="hopper")` runs it, and `schedule="fastest"` (the
default, `deterministic=False`) picks it on an sm_90 GPU from the key length HOPPER_MIN_SEQLEN
in launch.py measured it ahead (its launch settings: HOPPER_BACKWARD there). Everywhere else (the CPU interpreter, other GPUs, document ids,
head dims other than 64 / 128, float32, the deterministic schedule) the portable `tl` kernels in
backward.py run: they are the reference this kernel is tested against, and the readable version
of the same steps. Gluon (`triton.experimental.gluon`) exposes what `tl` leaves to the compiler
and the `tl` backward could not reach: warp specialization, asynchronous wgmma, an mbarrier
ring, and TMA bulk reduce-add (docs/perf-notes.md, v6-v7).

One program owns BLOCK_N keys of one (batch, kv head), on a 1-D grid whose order `_key_block`
sets (under causal the heaviest key blocks of L2-sized head groups first). Its steps, named as in
backward.py's `bwd_kv_kernel` (fused schedule):

    K, V: one TMA load each, resident in shared memory for the whole program
    for each query tile (BLOCK_M rows of one query head of the GQA group):
        recompute Sᵀ = K Qᵀ and dPᵀ = V dOᵀ            (async wgmma, both in flight)
        Pᵀ = exp2(Sᵀ · qk_scale − lse2)                 (causal / window mask on edge tiles only)
        dSᵀ = Pᵀ ∘ (dPᵀ − delta)
        dV += Pᵀ dO;  dK += dSᵀ Q                        (Pᵀ, dSᵀ as register operands)
        dQ share = scale · dS K                          (dSᵀ via shared memory, K resident)
        dQ[tile rows] += dQ share                        (one TMA bulk reduce-add, float32)
    dK · scale, dV: cast, stored (rows < Nk)

5 matmuls per tile where the deterministic two passes take 7 (S and dP are recomputed once).
Under causal the program starts at the first query block that sees its keys; under a sliding
window (WINDOW, masks.py's bounds) it visits only the query rows some of its keys are seen by
(tiles.tile_range, as bwd_kv_kernel), and masks the tiles at the window's two edges.

Who does what: a 1-warp producer partition (gl.warp_specialize) issues the TMA loads of Q, dO,
lse2 and delta into a STAGES-deep shared-memory ring (`ready[s]`: bytes landed, `empty[s]`: the
consumers are done with slot s). Two consumer warpgroups (8 warps, 64 keys each, FA3's layout)
run the wgmmas and the softmax arithmetic; they issue the dQ reduce themselves, which then runs
while the next tile's wgmmas do.

Edges. Descriptors are 2-D over the flattened (B·H·N, d) tensors (STRIDED: 4-D over (B, H, N, d)
with the inputs' own strides, so no copies): a query tile that runs past its head's last row
reads the next head's rows or TMA's zero fill. Those rows get
lse2 = +inf, so Pᵀ = dSᵀ = 0 there and their dQ adds are exact zeros. Key rows past Nk (the last
key block) must not reach dQ: Pᵀ = 0 there (the causal mask already does it; without it the key
tail is masked). lse2 / delta go through copies padded per head to a multiple of 32 rows: a 1-D
TMA box must start 16-byte aligned (an unaligned one stopped the kernel with an illegal instruction).

dQ is a sum of float32 shares in scheduling order: exact, not bitwise repeatable (the
deterministic schedule is the `tl` two-pass one). Limits: d ∈ {64, 128}, bf16 / fp16, int32
offsets (B·H·N·d < 2³¹); the launcher makes the inputs contiguous (unless STRIDED) and returns
the gradients in the inputs' layouts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.flash_attn.gluon_tma import (
    as_box,
    gl_dtype,
    grouped_order,
    l2_group,
    operand_descs,
    smem_layout,
    store_target,
    tma_desc,
)
from kernels.flash_attn.masks import resolve
from kernels.flash_attn.tiles import LOG2E, tile_range

if TYPE_CHECKING:
    from kernels.flash_attn.launch import HopperConfig



# ----------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------
@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA bulk reduce-add of shared-memory tile `src` into the descriptor's tensor at `coord`
    (cp.reduce.async.bulk.tensor ... .add; completion as for stores: tma.store_wait). Gluon 3.6's
    hopper.tma has no function for it, but its builder has the op `tl`'s descriptor atomic_add
    lowers to."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M: gl.constexpr):
    """Tile `it` of a program's flat loop over (query head g of the group, query block): the query
    block's first row m within the head, and that row's index in the flattened (B·Hq·Nq) tensors."""
    g = it // n_m
    m = lo + (it - g * n_m) * BLOCK_M
    return m, q_row0 + g * seqlen_q + m


@gluon.jit
def _zero(it, total, REMAT_DESC: gl.constexpr):
    """The index of the one-slot K / V / dSᵀ buffers in iteration `it`: 0. REMAT_DESC: it // total,
    also 0 (it < total) but not loop-invariant to the compiler, so the wgmma shared-memory
    descriptors built from these views are recomputed in the loop (cheap uniform-register adds)
    instead of hoisted out of it: hoisted, at head_dim 128 they outgrow the uniform registers and
    ptxas keeps them in general registers, which then spill."""
    if REMAT_DESC:
        z = it // total
    else:
        z = 0
    return z


@gluon.jit
def _key_block(pid, num_n, pair_group, heads_kv, batch):
    """Program pid's key block and (kv head, batch) on the 1-D grid, in gluon_tma.grouped_order's
    order: pair_group = 1 is a (key blocks, kv heads, batch) grid's; a larger one (causal launches)
    starts the first key blocks, which see the most query rows, of pair_group heads whose Q / dO
    fit in L2 together before the lighter ones, so the launch does not end on a heavy program."""
    pid_n, bh = grouped_order(pid, num_n, pair_group, heads_kv * batch)
    return pid_n, bh % heads_kv, bh // heads_kv


@gluon.jit
def _query_range(start_n, seqlen_q, seqlen_k, win_left, win_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """The query rows a key block visits, [lo, hi), and within them [full_lo, full_hi), the query
    blocks that see every key of the block (no positional mask); causal: the diagonal ones, below
    full_lo, masked (bwd_kv_kernel's bounds, bottom-right aligned). A window: key j is seen by rows
    [j − offset − right, j − offset + left] (tiles.tile_range, as bwd_kv_kernel)."""
    offset = seqlen_k - seqlen_q
    hi = seqlen_q
    full_hi = seqlen_q
    if CAUSAL:
        lo = gl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        full_lo = gl.minimum(gl.maximum(lo, gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M),
                             seqlen_q)
    elif WINDOW:
        lo, full_lo, full_hi, hi = tile_range(start_n, BLOCK_N, BLOCK_M, seqlen_q, -offset, win_right, win_left)
    else:
        lo = 0
        full_lo = 0
    return lo, full_lo, full_hi, hi


@gluon.jit
def _load_tile(descs, rings, ready, s, row, m, seqlen_q, heads_q, lse_stride, STRIDED: gl.constexpr):
    """TMA loads of tile rows [row, row + BLOCK_M) of Q, dO, lse2 and delta into ring slot s
    (lse2 / delta from the copies padded to lse_stride rows per head). STRIDED: Q and dO through
    4-D descriptors over the caller's (B, H, N, d) strides, at (b, h, m, 0)."""
    q_desc, do_desc, lse_desc, delta_desc = descs
    q_ring, do_ring, lse_ring, delta_ring = rings
    bar = ready.index(s)
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes
                    + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
    bh = (row - m) // seqlen_q  # batch · Hq + query head
    if STRIDED:
        tma.async_copy_global_to_shared(q_desc, [bh // heads_q, bh % heads_q, m, 0], bar, as_box(q_ring.index(s), q_desc))
        tma.async_copy_global_to_shared(do_desc, [bh // heads_q, bh % heads_q, m, 0], bar, as_box(do_ring.index(s), do_desc))
    else:
        tma.async_copy_global_to_shared(q_desc, [row, 0], bar, q_ring.index(s))
        tma.async_copy_global_to_shared(do_desc, [row, 0], bar, do_ring.index(s))
    lrow = bh * lse_stride + m
    tma.async_copy_global_to_shared(lse_desc, [lrow], bar, lse_ring.index(s))
    tma.async_copy_global_to_shared(delta_desc, [lrow], bar, delta_ring.index(s))


@gluon.jit
def _producer(descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, heads_q, lse_stride, total,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr, STRIDED: gl.constexpr):
    """The load warp: fill slot it % STAGES once the consumers released its previous tile."""
    for it in range(total):
        s = it % STAGES
        # the (it // STAGES)-th fill of slot s waits for release number it // STAGES − 1:
        # parity ((it // STAGES) & 1) ^ 1, which a fresh barrier passes at once
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        _load_tile(descs, rings, ready, s, row, m, seqlen_q, heads_q, lse_stride, STRIDED)


@gluon.jit
def _tile_grads(k_smem, v_smem, q_s, do_s, lse_s, delta_s, dk, dv, m, full_lo, full_hi, key_tail, offs_n, offs_m0,
                seqlen_q, seqlen_k, win_left, win_right, qk_scale, s_layout: gl.constexpr, a_layout: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                MASK_KEYS: gl.constexpr):
    """One query tile up to dK / dV: recompute Sᵀ, Pᵀ, dPᵀ, dSᵀ; issue dV += Pᵀ dO and dK += dSᵀ Q
    (async, left in flight). Returns (dk, dv) and dSᵀ in the input dtype. MASK_KEYS (a kernel whose
    dQ sums over the keys): on the last key block (key_tail), Pᵀ = 0 on key rows ≥ Nk."""
    ELEM: gl.constexpr = k_smem.dtype
    rows = m + offs_m0
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    # recompute Sᵀ and dPᵀ: both wgmmas in flight at once
    s_t = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dp_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(1, deps=(s_t,))
    # rows past Nq (the next head's, or TMA's zero fill) get lse2 = +inf: Pᵀ = 0 there
    lse2 = gl.where(rows < seqlen_q, lse_s.load(gl.SliceLayout(0, s_layout)), float("inf"))
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    if CAUSAL:
        if m < full_lo:  # a diagonal tile: query row i sees key j iff j <= i + offset (hence j < Nk)
            p_t = gl.where(offs_n[:, None] <= rows[None, :] + (seqlen_k - seqlen_q), p_t, 0.0)
    elif WINDOW:
        if (m < full_lo) | (m + BLOCK_M > full_hi) | key_tail:  # a window's edge, or keys past Nk
            # tiles.positions_visible's test, one bound at a time (each mask dies at once: fewer registers)
            offset = seqlen_k - seqlen_q
            p_t = gl.where(offs_n[:, None] <= rows[None, :] + (offset + win_right), p_t, 0.0)
            p_t = gl.where(offs_n[:, None] >= rows[None, :] + (offset - win_left), p_t, 0.0)
            p_t = gl.where(offs_n[:, None] < seqlen_k, p_t, 0.0)
    elif MASK_KEYS:
        if key_tail:  # the last key block: rows past Nk hold the next head's keys (or TMA's zeros)
            p_t = gl.where(offs_n[:, None] < seqlen_k, p_t, 0.0)
    dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
    delta = delta_s.load(gl.SliceLayout(0, s_layout))
    ds_t = p_t * (dp_t - delta[None, :])
    dv = warpgroup_mma(gl.convert_layout(p_t.to(ELEM), a_layout), do_s, dv, is_async=True)
    ds_t = ds_t.to(ELEM)
    dk = warpgroup_mma(gl.convert_layout(ds_t, a_layout), q_s, dk, is_async=True)
    return dk, dv, ds_t


@gluon.jit
def _store_kv(dk, dv, DK, DV, stride_dk_n, stride_dv_n, start_n, seqlen_k, softmax_scale, out_layout: gl.constexpr,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr):
    """Epilogue: dK·scale and dV, cast, rows < Nk of this key block, stored from out_layout. DK, DV
    point at the head's first row; rows are stride_*_n apart (any layout with unit stride along d)."""
    ELEM: gl.constexpr = DK.dtype.element_ty
    offs_on = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    offs_od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    ok = (offs_on < seqlen_k)[:, None] & (offs_od < HEAD_DIM)[None, :]
    gl.store(DK + offs_on[:, None] * stride_dk_n + offs_od[None, :],
             gl.convert_layout((dk * softmax_scale).to(ELEM), out_layout), mask=ok)
    gl.store(DV + offs_on[:, None] * stride_dv_n + offs_od[None, :], gl.convert_layout(dv.to(ELEM), out_layout), mask=ok)


# Sᵀ / dPᵀ (BLOCK_N, BLOCK_M) and dK / dV (BLOCK_N, HEAD_DIM) accumulators, keys along the warps;
# Pᵀ and dSᵀ as register A operands of the dV / dK wgmmas (the accumulator's own registers)
@gluon.constexpr_function
def s_layout_for(BLOCK_M, num_warps):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16])


@gluon.constexpr_function
def kv_layout_for(HEAD_DIM, num_warps):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])


@gluon.constexpr_function
def a_layout_for(HEAD_DIM, num_warps):
    return gl.DotOperandLayout(operand_index=0, parent=kv_layout_for(HEAD_DIM, num_warps), k_width=2)


# ----------------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _consumer(descs, rings, k_smem, v_smem, ds_smem, dq_smem, ready, empty, dq_desc, DK, DV, stride_dk_n, stride_dv_n,
              n_m, lo, full_lo, full_hi, q_row0, seqlen_q, seqlen_k, win_left, win_right, start_n, total, qk_scale,
              softmax_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, REMAT_DESC: gl.constexpr,
              num_warps: gl.constexpr):
    q_ring, do_ring, lse_ring, delta_ring = rings
    s_layout: gl.constexpr = s_layout_for(BLOCK_M, num_warps)
    kv_layout: gl.constexpr = kv_layout_for(HEAD_DIM, num_warps)
    a_layout: gl.constexpr = a_layout_for(HEAD_DIM, num_warps)
    # dQ tile (BLOCK_M, HEAD_DIM): one warpgroup along the rows, the warpgroups split the columns
    # (so each reads the other's rows of dSᵀ from shared memory)
    WG: gl.constexpr = num_warps // 4
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                        instr_shape=[16, HEAD_DIM // WG, 16])
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))  # per key (a row of Sᵀ)
    offs_m0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))  # per query row (a column of Sᵀ)
    key_tail = start_n + BLOCK_N > seqlen_k

    for it in range(total):
        s = it % STAGES
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        z = _zero(it, total, REMAT_DESC)
        k_cur = k_smem.index(z)
        ds_cur = ds_smem.index(z)
        dk, dv, ds_t = _tile_grads(k_cur, v_smem.index(z), q_ring.index(s), do_ring.index(s), lse_ring.index(s),
                                   delta_ring.index(s), dk, dv, m, full_lo, full_hi, key_tail, offs_n, offs_m0,
                                   seqlen_q, seqlen_k, win_left, win_right, qk_scale, s_layout, a_layout, BLOCK_M,
                                   BLOCK_N, CAUSAL, WINDOW, True)
        # dQ share = dS K: dSᵀ to shared memory, its transposed view as the wgmma's A operand
        ds_cur.store(ds_t)
        fence_async_shared()
        dq = warpgroup_mma(ds_cur.permute((1, 0)), k_cur, zero_dq, use_acc=False, is_async=True)
        dk, dv, dq = warpgroup_mma_wait(0, deps=(dk, dv, dq))  # this tile's wgmmas are done: its slot is free
        # Triton's membar pass puts a partition-wide barrier before this one-thread arrive, so both
        # warpgroups are past their reads of the slot
        mbarrier.arrive(empty.index(s))
        dq = dq * softmax_scale
        tma.store_wait(0)  # the previous tile's reduce has read the buffer
        dq_smem.store(dq)
        fence_async_shared()
        _tma_reduce_add(dq_desc, [row, 0], dq_smem)
    tma.store_wait(0)
    # stored from the accumulator layout itself: a convert_layout would need BLOCK_N × HEAD_DIM × 2
    # bytes of scratch that warp specialization keeps apart from the ring
    _store_kv(dk, dv, DK, DV, stride_dk_n, stride_dv_n, start_n, seqlen_k, softmax_scale, kv_layout, HEAD_DIM, BLOCK_N)


# lengths and head counts are not specialized (no recompiles for N == 1 or N % 16 == 0)
@gluon.jit(do_not_specialize=["heads_q", "heads_kv", "batch", "pair_group", "seqlen_q", "seqlen_k", "lse_stride",
                              "win_left", "win_right"])
def bwd_hopper_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_desc, DK, DV,
                      stride_dk_b, stride_dk_h, stride_dk_n, stride_dv_b, stride_dv_h, stride_dv_n, heads_q, heads_kv,
                      batch, pair_group, seqlen_q, seqlen_k, lse_stride, win_left, win_right, qk_scale, softmax_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, REMAT_DESC: gl.constexpr,
                      STRIDED: gl.constexpr, num_warps: gl.constexpr):
    pid_n, kvh, b = _key_block(gl.program_id(0), gl.cdiv(seqlen_k, BLOCK_N), pair_group, heads_kv, batch)
    start_n = pid_n * BLOCK_N
    group = heads_q // heads_kv
    kv_row0 = (b * heads_kv + kvh) * seqlen_k  # this head's first row in the flattened K, V
    DK += b * stride_dk_b + kvh * stride_dk_h  # dK, dV: this head, in the layout the caller's k, v have
    DV += b * stride_dv_b + kvh * stride_dv_h
    q_row0 = (b * heads_q + kvh * group) * seqlen_q  # the group's first row in flattened Q, dO, dQ
    lo, full_lo, full_hi, hi = _query_range(start_n, seqlen_q, seqlen_k, win_left, win_right, BLOCK_M, BLOCK_N, CAUSAL,
                                            WINDOW)
    n_m = gl.cdiv(hi - lo, BLOCK_M)
    total = group * n_m  # flat loop over (query head of the group, query block)

    # shared memory: K, V (resident; [1, ...] for _zero's views), the Q / dO / lse2 / delta ring,
    # dSᵀ for the dQ wgmma, the float32 dQ tile for the bulk reduce, barriers
    ELEM: gl.constexpr = k_desc.dtype
    # 2-D NVMMA layouts: the 2-D descriptors' own, and what a 4-D (STRIDED) box is reinterpreted from
    kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], ELEM)
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], ELEM)
    k_smem = gl.allocate_shared_memory(ELEM, [1, BLOCK_N, HEAD_DIM], kv_smem_layout)
    v_smem = gl.allocate_shared_memory(ELEM, [1, BLOCK_N, HEAD_DIM], kv_smem_layout)
    q_ring = gl.allocate_shared_memory(ELEM, [STAGES, BLOCK_M, HEAD_DIM], q_smem_layout)
    do_ring = gl.allocate_shared_memory(ELEM, [STAGES, BLOCK_M, HEAD_DIM], q_smem_layout)
    lse_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    ds_smem = gl.allocate_shared_memory(ELEM, [1, BLOCK_N, BLOCK_M], gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], ELEM))
    dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, HEAD_DIM], dq_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(kv_bar, count=1)
    fence_async_shared()
    descs = (q_desc, do_desc, lse_desc, delta_desc)
    rings = (q_ring, do_ring, lse_ring, delta_ring)

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    if STRIDED:
        tma.async_copy_global_to_shared(k_desc, [b, kvh, start_n, 0], kv_bar, as_box(k_smem.index(0), k_desc))
        tma.async_copy_global_to_shared(v_desc, [b, kvh, start_n, 0], kv_bar, as_box(v_smem.index(0), v_desc))
    else:
        tma.async_copy_global_to_shared(k_desc, [kv_row0 + start_n, 0], kv_bar, k_smem.index(0))
        tma.async_copy_global_to_shared(v_desc, [kv_row0 + start_n, 0], kv_bar, v_smem.index(0))
    mbarrier.wait(kv_bar, 0)

    gl.warp_specialize([
        (_consumer, (descs, rings, k_smem, v_smem, ds_smem, dq_smem, ready, empty, dq_desc, DK, DV, stride_dk_n,
                     stride_dv_n, n_m, lo, full_lo, full_hi, q_row0, seqlen_q, seqlen_k, win_left, win_right, start_n,
                     total, qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, REMAT_DESC,
                     num_warps)),
        (_producer, (descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, heads_q, lse_stride, total, BLOCK_M, STAGES,
                     STRIDED)),
    ], [1], [24])  # the producer: 1 warp, 24 registers (Triton pads it to a warpgroup; the consumers get the rest)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def row_descs(lse2: torch.Tensor, delta: torch.Tensor, block_m: int) -> tuple[TensorDescriptor, TensorDescriptor, int]:
    """1-D TMA descriptors (box block_m) over lse2 and delta, each head's rows padded to a multiple
    of 32 (16-byte aligned box starts; no copy when Nq % 32 == 0), and that row stride."""
    batch, heads_q, seqlen_q = lse2.shape
    stride = triton.cdiv(seqlen_q, 32) * 32
    if stride != seqlen_q:
        padded = torch.zeros(2, batch, heads_q, stride, device=lse2.device, dtype=torch.float32)
        padded[0, ..., :seqlen_q] = lse2
        padded[1, ..., :seqlen_q] = delta
        lse2, delta = padded[0], padded[1]
    layout = smem_layout((block_m,), gl.float32)
    lse2, delta = lse2.contiguous(), delta.contiguous()
    return (TensorDescriptor.from_tensor(lse2.view(-1), [block_m], layout),
            TensorDescriptor.from_tensor(delta.view(-1), [block_m], layout), stride)


def backward_hopper(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse2: torch.Tensor,
                    delta: torch.Tensor, causal: bool, scale: float, config: HopperConfig,
                    dq_float32: bool = False, window_size: tuple[int, int] = (-1, -1),
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in one pass. q, do (B, Hq, Nq, d), k, v (B, Hkv, Nk, d), bf16 / fp16, d 64 or 128
    (launch.hopper_unsupported checks the rest); causal and / or a sliding window (masks.py's
    convention); lse2 (base 2) from launch.forward; delta = launch.backward_delta(o, do).
    dq_float32: dQ as the float32 sum itself (contiguous), uncast."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    mask = resolve(causal, window_size, None, seqlen_q, seqlen_k)
    elem = gl_dtype(q.dtype)
    # dQ, dK, dV in q's, k's and v's layouts (torch.empty_like), as the `tl` launchers return them
    # and the custom op's fake kernel promises them to torch.compile. The kernel stores dK, dV by
    # pointer with unit stride along d: a layout strided there goes through a contiguous buffer.
    dq = None if dq_float32 else torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dk_out, dv_out = store_target(dk), store_target(dv)
    bm, bn = config.BLOCK_M, config.BLOCK_N
    descs = operand_descs([(q, bm), (do, bm), (k, bn), (v, bn)], elem, config.STRIDED)
    lse_desc, delta_desc, lse_stride = row_descs(lse2, delta, bm)
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    pair_group = 1
    if mask.causal and config.L2_GROUP_MB:  # the heads whose Q, dO (lse2, delta: small) share L2
        pair_group = l2_group(batch * heads_kv, config.L2_GROUP_MB << 20,
                              2 * (heads_q // heads_kv) * seqlen_q * head_dim * q.element_size())
    bwd_hopper_kernel[(triton.cdiv(seqlen_k, bn) * heads_kv * batch,)](
        *descs, lse_desc, delta_desc, tma_desc(dq_acc, bm, gl.float32), dk_out, dv_out, *dk_out.stride()[:3], *dv_out.stride()[:3],
        heads_q, heads_kv, batch, pair_group, seqlen_q, seqlen_k, lse_stride, mask.left, mask.right, scale * LOG2E.value, scale,
        HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, STAGES=config.STAGES, CAUSAL=mask.causal, WINDOW=mask.window,
        REMAT_DESC=config.REMAT_DESC, STRIDED=config.STRIDED, num_warps=config.num_warps,
    )
    for grad, out in ((dk, dk_out), (dv, dv_out)):
        if out is not grad:
            grad.copy_(out)
    if dq is None:
        return dq_acc, dk, dv
    return dq.copy_(dq_acc), dk, dv  # the cast to q's dtype writes q's layout in the same pass
