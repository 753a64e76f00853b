"""Gluon (triton.experimental.gluon, triton 3.6) Hopper kernel for the deterministic backward's dK/dV
pass, FlashAttention-3 style. An experiment: nothing in kernels/ calls it. Same math and names as
kernels/flash_attn/backward.py `bwd_kv_kernel` with ATOMIC_DQ=False (no window / document masks):

    recompute Pᵀ = exp2(K Qᵀ · qk_scale − lse2[None, :])    (rows past Nq: lse2 = +inf → Pᵀ = 0)
    dV += Pᵀ dO;   dPᵀ = V dOᵀ;   dSᵀ = Pᵀ ∘ (dPᵀ − delta[None, :]);   dK += dSᵀ Q;   dK *= scale

What runs where (one program = BLOCK_N keys of one (batch, kv head); grid (key blocks, Hkv, B)):
- K, V: one TMA load each into shared memory, resident for the whole program.
- Per query tile (BLOCK_M rows of one query head of the GQA group; the program loops over
  (group head, query block) flat): Q, dO (BLOCK_M, d) and lse2, delta (BLOCK_M,) go by TMA into a
  STAGES-deep shared-memory ring, with `ready[s]` (bytes landed) / `empty[s]` (readers done)
  mbarriers per slot.
    WS=True : a 1-warp producer partition (gl.warp_specialize; Triton pads it to a warpgroup and
              gives it 24 registers, the consumers 240 via setmaxnreg) issues the loads.
    WS=False: the consumer warps issue them, refilling a slot as soon as its tile is done (a
              CTA-wide bar.sync orders the refill after both warpgroups' reads).
- Consumers: num_warps compute warps, NVMMA layout warps_per_cta [num_warps, 1]: keys along the
  warps, 16 per warp. 8 warps × BLOCK_N 128: two warpgroups of 64 keys each (FA3's layout);
  4 warps × BLOCK_N 64: one warpgroup. Per tile (`_tile_grads`):
      issue Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (async wgmma; A = K / V in smem, B = Q / dO transposed smem views)
      wait Sᵀ → Pᵀ = exp2(...) in registers, the causal mask on diagonal tiles only
      wait dPᵀ → dSᵀ = Pᵀ ∘ (dPᵀ − delta)
      issue dV += Pᵀ·dO, dK += dSᵀ·Q (Pᵀ, dSᵀ as register A operands: DotOperandLayout, no smem)
  then wait for both and hand the slot back.
  REMAT_DESC (`_zero`): the wgmma shared-memory descriptors of K and V are rebuilt in every
  iteration instead of hoisted out of the loop (at d=128 the hoisted ones spill).
- Epilogue: dK·scale, cast, masked stores of the rows < Nk.

TMA descriptors are 2-D over the flattened (B·H·N, d) tensors: a tile that runs past its head's last
query row reads the next head's rows (or TMA's zero fill at the tensor's end). Those rows get
lse2 = +inf in registers, so Pᵀ = dSᵀ = 0 exactly there; key rows past Nk only make dK/dV rows that
are never stored. lse2 / delta: 1-D descriptors over copies whose per-head rows are padded to a
multiple of 32 (none is made when Nq % 32 == 0): on the H200 a 1-D TMA box starting at an address
that is not 16-byte aligned stopped the kernel with an illegal instruction (docs/perf-notes.md, v6).

The device helpers are the single-pass kernel's (kernels/flash_attn/backward_hopper.py), which
training runs on sm_90. Measured on the H200 (README.md); the variants that lost there (lse2 /
delta by pointer loads, EARLY_DV: dV's wgmma issued before the dPᵀ wait, one consumer warpgroup)
were removed with the knobs. Since, the code moved twice: for every variant left, the PTX differs
from the measured form's only in register numbering and unused parameters (compile_sm90.py --dump).
Limits: d ∈ {64, 128}, bf16 / fp16, contiguous (B, H, N, d) inputs, int32 offsets (B·H·N·d < 2³¹).
"""
import os
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma_wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# the device helpers are the single-pass kernel's, which training runs
from kernels.flash_attn.backward_hopper import (  # noqa: E402
    _load_tile,
    _producer,
    _query_range,
    _store_kv,
    _tile_grads,
    _tile_row,
    _zero,
    a_layout_for,
    kv_layout_for,
    row_descs,
    s_layout_for,
)
from kernels.flash_attn.gluon_tma import gl_dtype, tma_desc  # noqa: E402
from kernels.flash_attn.tiles import LOG2E  # noqa: E402


# ----------------------------------------------------------------------------------------------
# WS=False: the consumers fill the ring themselves
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _prologue(descs, rings, ready, n_m, lo, q_row0, seqlen_q, lse_stride, total,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """The consumers fill every slot before the first tile."""
    for i in gl.static_range(STAGES):
        if i < total:
            m, row = _tile_row(i, n_m, lo, q_row0, seqlen_q, BLOCK_M)
            _load_tile(descs, rings, ready, i, row, m, seqlen_q, 1, lse_stride, False)


@gluon.jit
def _release(descs, rings, ready, empty, done, n_m, lo, q_row0, seqlen_q, lse_stride, total,
             BLOCK_M: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr):
    """Tile `done`'s wgmmas have completed in this warpgroup: hand its slot back. WS: arrive on the
    slot's empty barrier (Triton's membar pass puts a partition-wide bar.sync before the one-thread
    arrive, so both warpgroups are past their reads). Not WS: refill the slot with tile done + STAGES."""
    s = done % STAGES
    if WS:
        mbarrier.arrive(empty.index(s))
    else:
        nxt = done + STAGES
        if nxt < total:
            gl.thread_barrier()  # both warpgroups are past their reads of the slot
            m, row = _tile_row(nxt, n_m, lo, q_row0, seqlen_q, BLOCK_M)
            _load_tile(descs, rings, ready, s, row, m, seqlen_q, 1, lse_stride, False)


# ----------------------------------------------------------------------------------------------
# The dK/dV kernel
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _consumer(descs, rings, k_smem, v_smem, ready, empty, DK, DV,
              n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0, start_n, total, qk_scale, softmax_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, WS: gl.constexpr, REMAT_DESC: gl.constexpr, num_warps: gl.constexpr):
    q_ring, do_ring, lse_ring, delta_ring = rings
    s_layout: gl.constexpr = s_layout_for(BLOCK_M, num_warps)
    kv_layout: gl.constexpr = kv_layout_for(HEAD_DIM, num_warps)
    a_layout: gl.constexpr = a_layout_for(HEAD_DIM, num_warps)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))  # per key (a row of Sᵀ)
    offs_m0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))  # per query row (a column of Sᵀ)

    if not WS:
        _prologue(descs, rings, ready, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES)
    for it in range(total):
        s = it % STAGES
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        z = _zero(it, total, REMAT_DESC)
        dk, dv, ds_t = _tile_grads(k_smem.index(z), v_smem.index(z), q_ring.index(s), do_ring.index(s), lse_ring.index(s),
                                   delta_ring.index(s), dk, dv, m, full_lo, False, offs_n, offs_m0,
                                   seqlen_q, seqlen_k, qk_scale, s_layout, a_layout, BLOCK_M, BLOCK_N, CAUSAL, False)
        dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))  # this tile's wgmmas done: its slot is free
        _release(descs, rings, ready, empty, it, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES, WS)
    # through a store-friendly blocked layout (the convert_layout's shared scratch is not the ring's)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1], [1, 0])
    _store_kv(dk, dv, DK + kv_row0 * HEAD_DIM, DV + kv_row0 * HEAD_DIM, HEAD_DIM, HEAD_DIM, start_n, seqlen_k,
              softmax_scale, out_layout, HEAD_DIM, BLOCK_N)


# lengths and head counts are not specialized (no recompiles for N == 1 or N % 16 == 0)
@gluon.jit(do_not_specialize=["heads_q", "heads_kv", "seqlen_q", "seqlen_k", "lse_stride"])
def bwd_dkdv_gluon_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, DK, DV,
                          heads_q, heads_kv, seqlen_q, seqlen_k, lse_stride, qk_scale, softmax_scale,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CAUSAL: gl.constexpr, WS: gl.constexpr, REMAT_DESC: gl.constexpr,
                          num_warps: gl.constexpr):
    pid_n = gl.program_id(0)  # grid (key blocks, kv heads, batch)
    kvh = gl.program_id(1)
    b = gl.program_id(2)
    start_n = pid_n * BLOCK_N
    group = heads_q // heads_kv
    kv_row0 = (b * heads_kv + kvh) * seqlen_k  # this head's first row in the flattened K, V, dK, dV
    q_row0 = (b * heads_q + kvh * group) * seqlen_q  # the group's first row in flattened Q, dO, lse2, delta
    lo, full_lo = _query_range(start_n, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)
    n_m = gl.cdiv(seqlen_q - lo, BLOCK_M)
    total = group * n_m  # flat loop over (query head of the group, query block)

    # shared memory: K, V (resident; [1, ...] for _zero's views), the Q / dO / lse2 / delta ring, barriers
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ring = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_ring = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    lse_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
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
    tma.async_copy_global_to_shared(k_desc, [kv_row0 + start_n, 0], kv_bar, k_smem.index(0))
    tma.async_copy_global_to_shared(v_desc, [kv_row0 + start_n, 0], kv_bar, v_smem.index(0))
    mbarrier.wait(kv_bar, 0)

    if WS:
        gl.warp_specialize([
            (_consumer, (descs, rings, k_smem, v_smem, ready, empty, DK, DV, n_m, lo, full_lo, q_row0, seqlen_q,
                         seqlen_k, lse_stride, kv_row0, start_n, total, qk_scale, softmax_scale,
                         HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS, REMAT_DESC, num_warps)),
            (_producer, (descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, 1, lse_stride, total, BLOCK_M, STAGES,
                         False)),
        ], [1], [24])
    else:
        _consumer(descs, rings, k_smem, v_smem, ready, empty, DK, DV, n_m, lo, full_lo, q_row0, seqlen_q,
                  seqlen_k, lse_stride, kv_row0, start_n, total, qk_scale, softmax_scale,
                  HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS, REMAT_DESC, num_warps)


# ----------------------------------------------------------------------------------------------
# Variants: BLOCK_M query rows per tile, BLOCK_N keys per program over num_warps consumer warps
# (16 keys per warp), STAGES ring slots, WS / REMAT_DESC as in the header. The ones measured on
# the H200 with lse2 / delta by pointer loads or EARLY_DV (README.md) lost and were removed.
# ----------------------------------------------------------------------------------------------
def _v(bn, warps, stages, ws, bm=64, remat=False):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, STAGES=stages, WS=ws, REMAT_DESC=remat)


VARIANTS = {
    # FA3's layout: 2 consumer warpgroups × 64 keys (BLOCK_N 128, 8 warps), 1-warp TMA producer
    "ws_wg2_s2": _v(128, 8, 2, True),
    "ws_wg2_s3": _v(128, 8, 3, True),
    # the same without warp specialization (the consumer warps issue the TMA loads)
    "nows_wg2_s2": _v(128, 8, 2, False),
    # descriptors rematerialized per iteration (_zero; no spills at d=128)
    "ws_wg2_s2_remat": _v(128, 8, 2, True, remat=True),
    "ws_wg2_s3_remat": _v(128, 8, 3, True, remat=True),
}


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
COMPILED = {}  # (kernel, variant, head_dim, dtype, causal) -> the first compiled kernel (n_regs, n_spills, metadata)


def backward_dkdv_gluon(do, q, k, v, lse2, delta, causal: bool, scale: float, variant: str = "ws_wg2_s2"):
    """(dk, dv) as launch.backward_dkdv returns them, by the Gluon kernel. q, do (B, Hq, Nq, d),
    k, v (B, Hkv, Nk, d) in bf16 / fp16, d in {64, 128}; lse2 (base 2), delta float32 (B, Hq, Nq)."""
    import torch
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    assert head_dim in (64, 128) and q.dtype in (torch.bfloat16, torch.float16)
    cfg = VARIANTS[variant]
    elem = gl_dtype(q.dtype)
    q, k, v, do = (t.contiguous() for t in (q, k, v, do))
    lse_desc, delta_desc, lse_stride = row_descs(lse2, delta, cfg["BLOCK_M"])
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(seqlen_k, bn), heads_kv, batch)
    compiled = bwd_dkdv_gluon_kernel[grid](
        tma_desc(q, bm, elem), tma_desc(do, bm, elem), tma_desc(k, bn, elem), tma_desc(v, bn, elem), lse_desc, delta_desc,
        dk, dv, heads_q, heads_kv, seqlen_q, seqlen_k, lse_stride, scale * LOG2E.value, scale,
        HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal, WS=cfg["WS"],
        REMAT_DESC=cfg["REMAT_DESC"], num_warps=cfg["num_warps"],
    )
    COMPILED.setdefault(("dkdv", variant, head_dim, str(q.dtype), causal), compiled)
    return dk, dv
