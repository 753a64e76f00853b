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
  then wait for both and hand the slot back. EARLY_DV: dV's wgmma is issued before the dPᵀ wait.
  REMAT_DESC (`_zero`): the wgmma shared-memory descriptors of K and V are rebuilt in every
  iteration instead of hoisted out of the loop (at d=128 the hoisted ones spill; not measured yet).
- Epilogue: dK·scale, cast, masked stores of the rows < Nk.

TMA descriptors are 2-D over the flattened (B·H·N, d) tensors: a tile that runs past its head's last
query row reads the next head's rows (or TMA's zero fill at the tensor's end). Those rows get
lse2 = +inf in registers, so Pᵀ = dSᵀ = 0 exactly there; key rows past Nk only make dK/dV rows that
are never stored. lse2 / delta (LSE_TMA): 1-D descriptors over copies whose per-head rows are padded
to a multiple of 32 (none is made when Nq % 32 == 0): on the H200 a 1-D TMA box starting at an
address that is not 16-byte aligned stopped the kernel with an illegal instruction
(docs/perf-notes.md, v6). LSE_TMA=False (variants *_lseptr): plain masked loads instead.

Measured on the H200 in an earlier form (README.md has the numbers). This file is that
kernel without its diagnostics (DEBUG, device-side descriptors) and unmeasured knobs (OVERLAP),
split into helpers that fused.py (the single-pass backward) shares. The measured variants' PTX
differs from the measured form's only in instruction placement: ptxas reports the same registers, spills and
shared memory for every warp-specialized variant (compile_sm90.py; without warp specialization
nows_wg2_s2 d=128 causal 248 → 250 registers, nows_wg2_s2_lseptr d=64 causal 227 → 242, no spills).
Limits: d ∈ {64, 128}, bf16 / fp16, contiguous (B, H, N, d) inputs, int32 offsets (B·H·N·d < 2³¹).
"""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------
# Device helpers (also used by fused.py)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M: gl.constexpr):
    """Tile `it` of a program's flat loop over (query head g of the group, query block): the query
    block's first row m within the head, and that row's index in the flattened (B·Hq·Nq) tensors."""
    g = it // n_m
    m = lo + (it - g * n_m) * BLOCK_M
    return m, q_row0 + g * seqlen_q + m


@gluon.jit
def _zero(it, total, REMAT_DESC: gl.constexpr):
    """The index of the one-slot K / V (/ dSᵀ) buffers in iteration `it`: 0. REMAT_DESC: it // total,
    also 0 (it < total) but not loop-invariant to the compiler, so the wgmma shared-memory
    descriptors built from these views are recomputed in the loop (cheap uniform-register adds)
    instead of hoisted out of it: hoisted, at head_dim 128 they outgrow the uniform registers and
    ptxas keeps them in general registers, which then spill (compile_sm90.py)."""
    if REMAT_DESC:
        z = it // total
    else:
        z = 0
    return z


@gluon.jit
def _query_range(start_n, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """The query blocks a key block visits: [lo, Nq); causal: the diagonal ones, below full_lo, masked
    (as bwd_kv_kernel's causal bounds)."""
    if CAUSAL:
        offset = seqlen_k - seqlen_q
        lo = gl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        full_lo = gl.minimum(gl.maximum(lo, gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M),
                             seqlen_q)
    else:
        lo = 0
        full_lo = 0
    return lo, full_lo


@gluon.jit
def _load_tile(descs, rings, ready, s, row, m, seqlen_q, lse_stride, LSE_TMA: gl.constexpr):
    """TMA loads of tile rows [row, row + BLOCK_M) of Q, dO (and lse2, delta: LSE_TMA) into ring slot s.
    lse2 / delta come from copies padded to lse_stride (a multiple of 32) per head: a 1-D TMA box
    must start 16-byte aligned (an unaligned start stopped the kernel with an illegal instruction)."""
    q_desc, do_desc, lse_desc, delta_desc = descs
    q_ring, do_ring, lse_ring, delta_ring = rings
    bar = ready.index(s)
    if LSE_TMA:
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes
                        + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
    else:
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row, 0], bar, q_ring.index(s))
    tma.async_copy_global_to_shared(do_desc, [row, 0], bar, do_ring.index(s))
    if LSE_TMA:
        lrow = (row - m) // seqlen_q * lse_stride + m
        tma.async_copy_global_to_shared(lse_desc, [lrow], bar, lse_ring.index(s))
        tma.async_copy_global_to_shared(delta_desc, [lrow], bar, delta_ring.index(s))


@gluon.jit
def _producer(descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, lse_stride, total,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr, LSE_TMA: gl.constexpr):
    """WS=True's load warp: fill slot it % STAGES once the consumers released its previous tile."""
    for it in range(total):
        s = it % STAGES
        # the (it // STAGES)-th fill of slot s waits for release number it // STAGES − 1:
        # parity ((it // STAGES) & 1) ^ 1, which a fresh barrier passes at once
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        _load_tile(descs, rings, ready, s, row, m, seqlen_q, lse_stride, LSE_TMA)


@gluon.jit
def _prologue(descs, rings, ready, n_m, lo, q_row0, seqlen_q, lse_stride, total,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr, LSE_TMA: gl.constexpr):
    """WS=False: the consumers fill every slot before the first tile."""
    for i in gl.static_range(STAGES):
        if i < total:
            m, row = _tile_row(i, n_m, lo, q_row0, seqlen_q, BLOCK_M)
            _load_tile(descs, rings, ready, i, row, m, seqlen_q, lse_stride, LSE_TMA)


@gluon.jit
def _release(descs, rings, ready, empty, done, n_m, lo, q_row0, seqlen_q, lse_stride, total,
             BLOCK_M: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr, LSE_TMA: gl.constexpr):
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
            _load_tile(descs, rings, ready, s, row, m, seqlen_q, lse_stride, LSE_TMA)


@gluon.jit
def _tile_grads(k_smem, v_smem, q_s, do_s, lse_s, delta_s, LSE, DELTA, dk, dv, m, row, full_lo, key_tail, offs_n, offs_m0,
                seqlen_q, seqlen_k, qk_scale, s_layout: gl.constexpr, a_layout: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KEYS: gl.constexpr,
                EARLY_DV: gl.constexpr, LSE_TMA: gl.constexpr, ISSUE_DK: gl.constexpr):
    """One query tile's steps up to dK / dV: recompute Sᵀ, Pᵀ, dPᵀ, dSᵀ, issue dV += Pᵀ dO and
    dK += dSᵀ Q (async, left in flight; ISSUE_DK=False: dK is left to the caller). Returns (dk, dv)
    and dSᵀ in the input dtype (s_layout). MASK_KEYS (fused.py, whose dQ sums over the keys): on the
    last key block (key_tail), Pᵀ = 0 on key rows ≥ Nk; needed without CAUSAL only (the causal mask
    zeroes them, and every tile of the last key block is a diagonal one)."""
    ELEM: gl.constexpr = k_smem.dtype
    rows = m + offs_m0
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    # recompute Sᵀ and dPᵀ: both wgmmas in flight at once
    s_t = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dp_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(1, deps=(s_t,))
    # rows past Nq (the next head's, or TMA's zero fill) get lse2 = +inf: Pᵀ = 0 there
    if LSE_TMA:
        lse2 = gl.where(rows < seqlen_q, lse_s.load(gl.SliceLayout(0, s_layout)), float("inf"))
    else:
        lse2 = gl.load(LSE + row + offs_m0, mask=rows < seqlen_q, other=float("inf"))
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    if CAUSAL:
        if m < full_lo:  # a diagonal tile: query row i sees key j iff j <= i + offset (hence j < Nk)
            p_t = gl.where(offs_n[:, None] <= rows[None, :] + (seqlen_k - seqlen_q), p_t, 0.0)
    elif MASK_KEYS:
        if key_tail:  # the last key block: rows past Nk hold the next head's keys (or TMA's zeros)
            p_t = gl.where(offs_n[:, None] < seqlen_k, p_t, 0.0)
    if EARLY_DV:  # dV's wgmma runs while dSᵀ is computed (Pᵀ's 16-bit copy stays live meanwhile)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(ELEM), a_layout), do_s, dv, is_async=True)
        dp_t = warpgroup_mma_wait(1, deps=(dp_t,))
    else:
        dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
    if LSE_TMA:
        delta = delta_s.load(gl.SliceLayout(0, s_layout))
    else:
        delta = gl.load(DELTA + row + offs_m0, mask=rows < seqlen_q, other=0.0)
    ds_t = p_t * (dp_t - delta[None, :])
    if not EARLY_DV:
        dv = warpgroup_mma(gl.convert_layout(p_t.to(ELEM), a_layout), do_s, dv, is_async=True)
    ds_t = ds_t.to(ELEM)
    if ISSUE_DK:
        dk = warpgroup_mma(gl.convert_layout(ds_t, a_layout), q_s, dk, is_async=True)
    return dk, dv, ds_t


@gluon.jit
def _store_kv(dk, dv, DK, DV, kv_row0, start_n, seqlen_k, softmax_scale,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, DIRECT: gl.constexpr, num_warps: gl.constexpr):
    """Epilogue: dK·scale and dV, cast, rows < Nk of this key block. DIRECT=False: through a
    store-friendly blocked layout (a convert_layout whose shared scratch, BLOCK_N × HEAD_DIM × 2
    bytes, is not shared with the ring under warp specialization). DIRECT: from the accumulator
    layout itself (4-byte stores; no scratch)."""
    ELEM: gl.constexpr = DK.dtype.element_ty
    if DIRECT:
        out_layout: gl.constexpr = dk.type.layout
    else:
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1], [1, 0])
    offs_on = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    offs_od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    ptr_off = (kv_row0 + offs_on)[:, None] * HEAD_DIM + offs_od[None, :]
    ok = (offs_on < seqlen_k)[:, None] & (offs_od < HEAD_DIM)[None, :]
    gl.store(DK + ptr_off, gl.convert_layout((dk * softmax_scale).to(ELEM), out_layout), mask=ok)
    gl.store(DV + ptr_off, gl.convert_layout(dv.to(ELEM), out_layout), mask=ok)


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
# The dK/dV kernel
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _consumer(descs, rings, k_smem, v_smem, ready, empty, DK, DV, LSE, DELTA,
              n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0, start_n, total, qk_scale, softmax_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, WS: gl.constexpr, EARLY_DV: gl.constexpr, LSE_TMA: gl.constexpr,
              REMAT_DESC: gl.constexpr, num_warps: gl.constexpr):
    q_ring, do_ring, lse_ring, delta_ring = rings
    s_layout: gl.constexpr = s_layout_for(BLOCK_M, num_warps)
    kv_layout: gl.constexpr = kv_layout_for(HEAD_DIM, num_warps)
    a_layout: gl.constexpr = a_layout_for(HEAD_DIM, num_warps)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))  # per key (a row of Sᵀ)
    offs_m0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))  # per query row (a column of Sᵀ)

    if not WS:
        _prologue(descs, rings, ready, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES, LSE_TMA)
    for it in range(total):
        s = it % STAGES
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        z = _zero(it, total, REMAT_DESC)
        dk, dv, ds_t = _tile_grads(k_smem.index(z), v_smem.index(z), q_ring.index(s), do_ring.index(s), lse_ring.index(s),
                                   delta_ring.index(s), LSE, DELTA, dk, dv, m, row, full_lo, False, offs_n, offs_m0,
                                   seqlen_q, seqlen_k, qk_scale, s_layout, a_layout,
                                   BLOCK_M, BLOCK_N, CAUSAL, False, EARLY_DV, LSE_TMA, True)
        dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))  # this tile's wgmmas done: its slot is free
        _release(descs, rings, ready, empty, it, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES, WS, LSE_TMA)
    _store_kv(dk, dv, DK, DV, kv_row0, start_n, seqlen_k, softmax_scale, HEAD_DIM, BLOCK_N, False, num_warps)


# lengths and head counts are not specialized (no recompiles for N == 1 or N % 16 == 0)
@gluon.jit(do_not_specialize=["heads_q", "heads_kv", "seqlen_q", "seqlen_k", "lse_stride"])
def bwd_dkdv_gluon_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, DK, DV, LSE, DELTA,
                          heads_q, heads_kv, seqlen_q, seqlen_k, lse_stride, qk_scale, softmax_scale,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CAUSAL: gl.constexpr, WS: gl.constexpr,
                          EARLY_DV: gl.constexpr, LSE_TMA: gl.constexpr, REMAT_DESC: gl.constexpr,
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
            (_consumer, (descs, rings, k_smem, v_smem, ready, empty, DK, DV, LSE, DELTA,
                         n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0, start_n, total, qk_scale,
                         softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS, EARLY_DV, LSE_TMA, REMAT_DESC, num_warps)),
            (_producer, (descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES,
                         LSE_TMA)),
        ], [1], [24])
    else:
        _consumer(descs, rings, k_smem, v_smem, ready, empty, DK, DV, LSE, DELTA,
                  n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0, start_n, total, qk_scale,
                  softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS, EARLY_DV, LSE_TMA, REMAT_DESC, num_warps)


# ----------------------------------------------------------------------------------------------
# Variants: BLOCK_M query rows per tile, BLOCK_N keys per program over num_warps consumer warps
# (16 keys per warp), STAGES ring slots, WS / EARLY_DV / LSE_TMA as in the header. The ones
# measured on the H200 (README.md); run 1's others (OVERLAP, BLOCK_M 128, device-side
# descriptors) were dropped unmeasured.
# ----------------------------------------------------------------------------------------------
def _v(bn, warps, stages, ws, early_dv=False, lse_tma=True, bm=64, remat=False):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, STAGES=stages, WS=ws, EARLY_DV=early_dv, LSE_TMA=lse_tma,
                REMAT_DESC=remat)


VARIANTS = {
    # FA3's layout: 2 consumer warpgroups × 64 keys (BLOCK_N 128, 8 warps), 1-warp TMA producer
    "ws_wg2_s2": _v(128, 8, 2, True),
    "ws_wg2_s3": _v(128, 8, 3, True),
    # the same without warp specialization (the consumer warps issue the TMA loads)
    "nows_wg2_s2": _v(128, 8, 2, False),
    # lse2 / delta by pointer loads into registers instead of 1-D TMA
    "ws_wg2_s2_lseptr": _v(128, 8, 2, True, lse_tma=False),
    "ws_wg2_s2_early_lseptr": _v(128, 8, 2, True, early_dv=True, lse_tma=False),
    "nows_wg2_s2_lseptr": _v(128, 8, 2, False, lse_tma=False),
    # one consumer warpgroup × 64 keys
    "ws_wg1_s2_lseptr": _v(64, 4, 2, True, lse_tma=False),
    # not measured yet: descriptors rematerialized per iteration (_zero; no spills at d=128)
    "ws_wg2_s2_remat": _v(128, 8, 2, True, remat=True),
    "ws_wg2_s3_remat": _v(128, 8, 3, True, remat=True),
}


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def smem_layout(block_shape, elem):
    """The NVMMA shared layout of a TMA tile; elem: a gluon dtype."""
    return gl.NVMMASharedLayout.get_default_for(block_shape, elem)


def gl_dtype(torch_dtype):
    import torch
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[torch_dtype]


def tma_desc(t, block_rows, elem):
    """A 2-D descriptor over t viewed as (rows, last dim), box (block_rows, last dim)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    flat = t.view(-1, t.shape[-1])
    return TensorDescriptor.from_tensor(flat, [block_rows, t.shape[-1]], smem_layout([block_rows, t.shape[-1]], elem))


def row_descs(lse2, delta, block_m, lse_tma: bool):
    """lse2, delta flattened (pointer loads), their 1-D TMA descriptors (box block_m) over copies
    padded per head to a multiple of 32 rows (16-byte aligned box starts), and that row stride."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    batch, heads_q, seqlen_q = lse2.shape
    lse2, delta = lse2.contiguous(), delta.contiguous()
    lse_stride = triton.cdiv(seqlen_q, 32) * 32 if lse_tma else seqlen_q
    if lse_stride != seqlen_q:
        lse_pad = torch.zeros(batch, heads_q, lse_stride, device=lse2.device, dtype=torch.float32)
        delta_pad = torch.zeros_like(lse_pad)
        lse_pad[..., :seqlen_q] = lse2
        delta_pad[..., :seqlen_q] = delta
    else:
        lse_pad, delta_pad = lse2, delta
    layout = smem_layout([block_m], gl.float32)
    lse_desc = TensorDescriptor.from_tensor(lse_pad.view(-1), [block_m], layout)
    delta_desc = TensorDescriptor.from_tensor(delta_pad.view(-1), [block_m], layout)
    return lse2.view(-1), delta.view(-1), lse_desc, delta_desc, lse_stride


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
    lse_flat, delta_flat, lse_desc, delta_desc, lse_stride = row_descs(lse2, delta, cfg["BLOCK_M"], cfg["LSE_TMA"])
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(seqlen_k, bn), heads_kv, batch)
    compiled = bwd_dkdv_gluon_kernel[grid](
        tma_desc(q, bm, elem), tma_desc(do, bm, elem), tma_desc(k, bn, elem), tma_desc(v, bn, elem), lse_desc, delta_desc,
        dk, dv, lse_flat, delta_flat, heads_q, heads_kv, seqlen_q, seqlen_k, lse_stride, scale * LOG2E, scale,
        HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal, WS=cfg["WS"],
        EARLY_DV=cfg["EARLY_DV"], LSE_TMA=cfg["LSE_TMA"], REMAT_DESC=cfg["REMAT_DESC"], num_warps=cfg["num_warps"],
    )
    COMPILED.setdefault(("dkdv", variant, head_dim, str(q.dtype), causal), compiled)
    return dk, dv
