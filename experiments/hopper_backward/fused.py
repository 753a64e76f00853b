"""The single-pass (FlashAttention-3) backward in Gluon for Hopper: the dK/dV kernel of dkdv.py that
also produces dQ, so S and dP are recomputed once (5 matmuls) instead of twice (the two-pass
schedule's 7). An experiment: nothing in kernels/ calls it. Steps per query tile, named as in
kernels/flash_attn/backward.py (the fused schedule of `bwd_kv_kernel`, ATOMIC_DQ with TMA_DQ):

    recompute Pᵀ, dPᵀ;  dSᵀ = Pᵀ ∘ (dPᵀ − delta);  dV += Pᵀ dO;  dK += dSᵀ Q     (dkdv._tile_grads)
    dQ share = scale · dS K for the tile's BLOCK_M query rows, added into a zeroed float32
    (B, Hq, Nq, d) buffer that the launcher casts to q's dtype at the end

The dQ share: dSᵀ (BLOCK_N, BLOCK_M, input dtype) goes to shared memory; a wgmma with A = its
transposed view (dS, BLOCK_M × BLOCK_N) and B = K (resident in shared memory) gives the
(BLOCK_M, d) float32 tile in registers. With 8 consumer warps the tile's layout is
warps_per_cta [4, 2]: each warpgroup computes half of dQ's columns over all BLOCK_N keys, so it
reads the other warpgroup's rows of dSᵀ (Triton's membar pass puts the consumer-wide barriers
between the dSᵀ stores, the wgmma, and the next tile's stores). The tile is scaled, written to a
float32 shared buffer, fenced (fence_async_shared) and added to global memory by a TMA bulk
reduce-add of the whole tile (cp.reduce.async.bulk.tensor ... .add). Gluon 3.6 has no language
function for it (hopper.tma has async_copy_shared_to_global and store_wait only), but its builder
has create_async_tma_reduce (ttng.async_tma_reduce, what `tl` descriptor atomic_add lowers to);
`_tma_reduce_add` below wraps it. Who issues the reduce (DQ_MODE):
    DQ_TMA    : the consumers: store_wait(0) (the previous reduce has read the buffer), store,
                fence, reduce; it then runs while the next tile's wgmmas do.
    DQ_WRITER : a separate 1-warp partition, as FA3's dQ writer warp: the consumers wait on
                dq_empty[b], store, fence, arrive on dq_full[b]; the writer waits dq_full[b],
                issues the reduce, store_wait(0), arrives on dq_empty[b]. DQ_BUFS buffers.
    DQ_ATOMIC : no shared buffer: gl.atomic_add (float32, relaxed) of the register tile, rows < Nq.

Rows and keys past the ends: the 2-D dQ descriptor is over the flattened (B·Hq·Nq, d) buffer like
Q's, so a tile past its head's last row adds into the next head's rows; those rows have lse2 = +inf,
hence dS = 0 and an added 0 (±0 + x = x), and TMA drops rows past the buffer's end. Key rows
past Nk (the last key block, whose K rows are the next head's or zeros) must not contribute to
dQ: Pᵀ = 0 there (MASK_KEYS; the causal mask already does it on its diagonal tiles, and under
it every tile of the last key block is diagonal).

Other knobs: DK_SMEM (dK's wgmma reads dSᵀ from the shared buffer instead of registers),
DQ_AFTER_KV (wait for dK / dV before issuing dQ's wgmma), REMAT_DESC (dkdv._zero; on by default
here: with the descriptors hoisted, d=128 spills 150-200 bytes per thread, rebuilt in the loop
it spills none). dK / dV are stored straight from the accumulator layout (no convert_layout
scratch, which warp specialization keeps apart from the ring: 32 KB at d=128).

dQ is a sum of float32 shares in scheduling order: not bitwise reproducible (neither is the `tl`
fused schedule's); dK, dV are computed as in dkdv.py. Status: compiled for sm_90 (compile_sm90.py)
and its index logic modelled in numpy (index_model.py); not yet run on a GPU (check.py does that).
"""
import triton
from dkdv import (
    COMPILED,
    LOG2E,
    _producer,
    _prologue,
    _query_range,
    _release,
    _store_kv,
    _tile_grads,
    _tile_row,
    _zero,
    a_layout_for,
    gl_dtype,
    kv_layout_for,
    row_descs,
    s_layout_for,
    tma_desc,
)
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

DQ_TMA = 0
DQ_WRITER = 1
DQ_ATOMIC = 2


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA bulk reduce-add of shared-memory tile `src` into the descriptor's tensor at `coord`
    (ttng.async_tma_reduce ADD; completion as for async_copy_shared_to_global: tma.store_wait)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _dq_writer(dq_desc, dq_smem, dq_full, dq_empty, n_m, lo, q_row0, seqlen_q, total,
               BLOCK_M: gl.constexpr, DQ_BUFS: gl.constexpr):
    """DQ_WRITER's warp: tile it's dQ share from buffer it % DQ_BUFS into global memory."""
    for it in range(total):
        b = it % DQ_BUFS
        mbarrier.wait(dq_full.index(b), (it // DQ_BUFS) & 1)
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        _tma_reduce_add(dq_desc, [row, 0], dq_smem.index(b))
        tma.store_wait(0)  # the bulk op has read the buffer (its global adds complete on their own)
        gl.thread_barrier()  # (the lane that issued it is past its wait before the arrive)
        mbarrier.arrive(dq_empty.index(b))


@gluon.jit
def _fused_consumer(descs, rings, k_smem, v_smem, ds_smem, dq_smem, ready, empty, dq_full, dq_empty, dq_desc,
                    DK, DV, DQ, LSE, DELTA, n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0, start_n,
                    total, qk_scale, softmax_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    CAUSAL: gl.constexpr, WS: gl.constexpr, EARLY_DV: gl.constexpr, LSE_TMA: gl.constexpr,
                    DQ_MODE: gl.constexpr, DQ_BUFS: gl.constexpr, DK_SMEM: gl.constexpr, DQ_AFTER_KV: gl.constexpr,
                    REMAT_DESC: gl.constexpr, num_warps: gl.constexpr):
    q_ring, do_ring, lse_ring, delta_ring = rings
    s_layout: gl.constexpr = s_layout_for(BLOCK_M, num_warps)
    kv_layout: gl.constexpr = kv_layout_for(HEAD_DIM, num_warps)
    a_layout: gl.constexpr = a_layout_for(HEAD_DIM, num_warps)
    # dQ tile (BLOCK_M, HEAD_DIM): one warpgroup along the rows; further warpgroups split the columns
    WG: gl.constexpr = num_warps // 4
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                        instr_shape=[16, HEAD_DIM // WG, 16])
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    offs_m0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    key_tail = start_n + BLOCK_N > seqlen_k

    if not WS:
        _prologue(descs, rings, ready, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES, LSE_TMA)
    for it in range(total):
        s = it % STAGES
        m, row = _tile_row(it, n_m, lo, q_row0, seqlen_q, BLOCK_M)
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        z = _zero(it, total, REMAT_DESC)
        k_cur = k_smem.index(z)
        ds_cur = ds_smem.index(z)
        dk, dv, ds_t = _tile_grads(k_cur, v_smem.index(z), q_ring.index(s), do_ring.index(s), lse_ring.index(s),
                                   delta_ring.index(s), LSE, DELTA, dk, dv, m, row, full_lo, key_tail, offs_n, offs_m0,
                                   seqlen_q, seqlen_k, qk_scale, s_layout, a_layout,
                                   BLOCK_M, BLOCK_N, CAUSAL, True, EARLY_DV, LSE_TMA, not DK_SMEM)
        # dQ share = dS K: dSᵀ to shared memory, its transposed view as the wgmma's A operand
        ds_cur.store(ds_t)
        fence_async_shared()
        if DK_SMEM:  # dK += dSᵀ Q from the same buffer: dSᵀ's registers are free before the dQ wgmma
            dk = warpgroup_mma(ds_cur, q_ring.index(s), dk, is_async=True)
        if DQ_AFTER_KV:  # dK, dV done first: their operands' registers are free for dQ's accumulator
            dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
        dq = warpgroup_mma(ds_cur.permute((1, 0)), k_cur, zero_dq, use_acc=False, is_async=True)
        dk, dv, dq = warpgroup_mma_wait(0, deps=(dk, dv, dq))  # this tile's wgmmas done: its slot is free
        _release(descs, rings, ready, empty, it, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES, WS, LSE_TMA)
        dq = dq * softmax_scale
        if DQ_MODE == 0:  # DQ_TMA
            tma.store_wait(0)  # the previous tile's reduce has read the buffer
            dq_smem.index(0).store(dq)
            fence_async_shared()
            _tma_reduce_add(dq_desc, [row, 0], dq_smem.index(0))
        elif DQ_MODE == 1:  # DQ_WRITER
            b = it % DQ_BUFS
            mbarrier.wait(dq_empty.index(b), ((it // DQ_BUFS) & 1) ^ 1)
            dq_smem.index(b).store(dq)
            fence_async_shared()
            gl.thread_barrier()  # every consumer's stores are fenced before the one-thread arrive
            mbarrier.arrive(dq_full.index(b))
        else:  # DQ_ATOMIC
            rows_q = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
            offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
            ptrs = DQ + (row - m + rows_q)[:, None] * HEAD_DIM + offs_d[None, :]
            gl.atomic_add(ptrs, dq, mask=(rows_q < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :], sem="relaxed")
    if DQ_MODE == 0:
        tma.store_wait(0)
    _store_kv(dk, dv, DK, DV, kv_row0, start_n, seqlen_k, softmax_scale, HEAD_DIM, BLOCK_N, True, num_warps)


@gluon.jit(do_not_specialize=["heads_q", "heads_kv", "seqlen_q", "seqlen_k", "lse_stride"])
def bwd_fused_gluon_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_desc, DK, DV, DQ, LSE, DELTA,
                           heads_q, heads_kv, seqlen_q, seqlen_k, lse_stride, qk_scale, softmax_scale,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           STAGES: gl.constexpr, CAUSAL: gl.constexpr, WS: gl.constexpr,
                           EARLY_DV: gl.constexpr, LSE_TMA: gl.constexpr, DQ_MODE: gl.constexpr,
                           DQ_BUFS: gl.constexpr, DK_SMEM: gl.constexpr, DQ_AFTER_KV: gl.constexpr,
                           REMAT_DESC: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(WS or DQ_MODE != 1, "DQ_WRITER needs WS (the writer is a partition)")
    pid_n = gl.program_id(0)  # grid (key blocks, kv heads, batch)
    kvh = gl.program_id(1)
    b = gl.program_id(2)
    start_n = pid_n * BLOCK_N
    group = heads_q // heads_kv
    kv_row0 = (b * heads_kv + kvh) * seqlen_k
    q_row0 = (b * heads_q + kvh * group) * seqlen_q
    lo, full_lo = _query_range(start_n, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)
    n_m = gl.cdiv(seqlen_q - lo, BLOCK_M)
    total = group * n_m

    ELEM: gl.constexpr = k_desc.dtype
    k_smem = gl.allocate_shared_memory(ELEM, [1, BLOCK_N, HEAD_DIM], k_desc.layout)  # [1, ...]: dkdv._zero
    v_smem = gl.allocate_shared_memory(ELEM, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ring = gl.allocate_shared_memory(ELEM, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_ring = gl.allocate_shared_memory(ELEM, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    lse_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    # dSᵀ (BLOCK_N, BLOCK_M) for the dQ wgmma, and the float32 dQ tile(s) for the bulk reduce
    ds_smem = gl.allocate_shared_memory(ELEM, [1, BLOCK_N, BLOCK_M], gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], ELEM))
    if DQ_MODE == 2:
        dq_smem = ds_smem  # (unused)
    else:
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_BUFS, BLOCK_M, HEAD_DIM], dq_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_BUFS, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_BUFS, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(DQ_BUFS):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    mbarrier.init(kv_bar, count=1)
    fence_async_shared()
    descs = (q_desc, do_desc, lse_desc, delta_desc)
    rings = (q_ring, do_ring, lse_ring, delta_ring)

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row0 + start_n, 0], kv_bar, k_smem.index(0))
    tma.async_copy_global_to_shared(v_desc, [kv_row0 + start_n, 0], kv_bar, v_smem.index(0))
    mbarrier.wait(kv_bar, 0)

    if WS:
        if DQ_MODE == 1:
            gl.warp_specialize([
                (_fused_consumer, (descs, rings, k_smem, v_smem, ds_smem, dq_smem, ready, empty, dq_full, dq_empty, dq_desc,
                                   DK, DV, DQ, LSE, DELTA, n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0,
                                   start_n, total, qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS,
                                   EARLY_DV, LSE_TMA, DQ_MODE, DQ_BUFS, DK_SMEM, DQ_AFTER_KV, REMAT_DESC, num_warps)),
                (_producer, (descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES,
                             LSE_TMA)),
                (_dq_writer, (dq_desc, dq_smem, dq_full, dq_empty, n_m, lo, q_row0, seqlen_q, total, BLOCK_M, DQ_BUFS)),
            ], [1, 1], [24, 24])
        else:
            gl.warp_specialize([
                (_fused_consumer, (descs, rings, k_smem, v_smem, ds_smem, dq_smem, ready, empty, dq_full, dq_empty, dq_desc,
                                   DK, DV, DQ, LSE, DELTA, n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0,
                                   start_n, total, qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS,
                                   EARLY_DV, LSE_TMA, DQ_MODE, DQ_BUFS, DK_SMEM, DQ_AFTER_KV, REMAT_DESC, num_warps)),
                (_producer, (descs, rings, ready, empty, n_m, lo, q_row0, seqlen_q, lse_stride, total, BLOCK_M, STAGES,
                             LSE_TMA)),
            ], [1], [24])
    else:
        _fused_consumer(descs, rings, k_smem, v_smem, ds_smem, dq_smem, ready, empty, dq_full, dq_empty, dq_desc,
                        DK, DV, DQ, LSE, DELTA, n_m, lo, full_lo, q_row0, seqlen_q, seqlen_k, lse_stride, kv_row0,
                        start_n, total, qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS,
                        EARLY_DV, LSE_TMA, DQ_MODE, DQ_BUFS, DK_SMEM, DQ_AFTER_KV, REMAT_DESC, num_warps)


# ----------------------------------------------------------------------------------------------
# Variants: dkdv.py's knobs, plus DQ_MODE (who adds the dQ share, see the header) and DQ_BUFS.
# ----------------------------------------------------------------------------------------------
def _v(bn, warps, stages, ws, dq_mode, dq_bufs=1, early_dv=False, lse_tma=True, bm=64, dk_smem=False, dq_after_kv=False,
       remat=True):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, STAGES=stages, WS=ws, EARLY_DV=early_dv, LSE_TMA=lse_tma,
                DQ_MODE=dq_mode, DQ_BUFS=dq_bufs, DK_SMEM=dk_smem, DQ_AFTER_KV=dq_after_kv, REMAT_DESC=remat)


VARIANTS = {
    # the dK/dV pass's best layout (2 consumer warpgroups × 64 keys, 1-warp TMA producer); the
    # consumers issue the dQ reduce
    "fused_ws_wg2_s2_tma": _v(128, 8, 2, True, DQ_TMA),
    "fused_ws_wg2_s3_tma": _v(128, 8, 3, True, DQ_TMA),
    # the same with the K / V / dSᵀ descriptors hoisted out of the loop (spills at d=128)
    "fused_ws_wg2_s2_tma_hoist": _v(128, 8, 2, True, DQ_TMA, remat=False),
    # FA3's dQ writer warp, one or two dQ buffers
    "fused_ws_wg2_s2_writer": _v(128, 8, 2, True, DQ_WRITER),
    "fused_ws_wg2_s2_writer2": _v(128, 8, 2, True, DQ_WRITER, dq_bufs=2),
    # dK's wgmma reads dSᵀ from the shared buffer (not registers); dQ's wgmma after dK's and dV's
    "fused_ws_wg2_s2_tma_dksmem": _v(128, 8, 2, True, DQ_TMA, dk_smem=True),
    "fused_ws_wg2_s2_tma_serial": _v(128, 8, 2, True, DQ_TMA, dq_after_kv=True),
    # the fallback: per-element float32 atomics of the register tile
    "fused_ws_wg2_s2_atomic": _v(128, 8, 2, True, DQ_ATOMIC),
    # no warp specialization; one consumer warpgroup × 64 keys
    "fused_nows_wg2_s2_tma": _v(128, 8, 2, False, DQ_TMA),
    "fused_ws_wg1_s2_tma": _v(64, 4, 2, True, DQ_TMA),
}


def backward_fused_gluon(do, q, k, v, lse2, delta, causal: bool, scale: float, variant: str = "fused_ws_wg2_s2_tma"):
    """(dq, dk, dv) in one pass. q, do (B, Hq, Nq, d), k, v (B, Hkv, Nk, d) in bf16 / fp16, d in
    {64, 128}; lse2 (base 2) from launch.forward, delta = launch.backward_delta(o, do), float32 (B, Hq, Nq)."""
    import torch
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    assert head_dim in (64, 128) and q.dtype in (torch.bfloat16, torch.float16)
    cfg = VARIANTS[variant]
    elem = gl_dtype(q.dtype)
    q, k, v, do = (t.contiguous() for t in (q, k, v, do))
    lse_flat, delta_flat, lse_desc, delta_desc, lse_stride = row_descs(lse2, delta, cfg["BLOCK_M"], cfg["LSE_TMA"])
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(seqlen_k, bn), heads_kv, batch)
    compiled = bwd_fused_gluon_kernel[grid](
        tma_desc(q, bm, elem), tma_desc(do, bm, elem), tma_desc(k, bn, elem), tma_desc(v, bn, elem), lse_desc, delta_desc,
        tma_desc(dq_acc, bm, gl.float32), dk, dv, dq_acc, lse_flat, delta_flat,
        heads_q, heads_kv, seqlen_q, seqlen_k, lse_stride, scale * LOG2E, scale,
        HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal, WS=cfg["WS"],
        EARLY_DV=cfg["EARLY_DV"], LSE_TMA=cfg["LSE_TMA"], DQ_MODE=cfg["DQ_MODE"], DQ_BUFS=cfg["DQ_BUFS"],
        DK_SMEM=cfg["DK_SMEM"], DQ_AFTER_KV=cfg["DQ_AFTER_KV"], REMAT_DESC=cfg["REMAT_DESC"], num_warps=cfg["num_warps"],
    )
    COMPILED.setdefault(("fused", variant, head_dim, str(q.dtype), causal), compiled)
    return dq_acc.to(q.dtype), dk, dv
