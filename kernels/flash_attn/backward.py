"""The backward kernels (FlashAttention-2, Algorithm 2, with recomputation).

Each needs delta = rowsum(dO ∘ O) (= rowsum(P ∘ dP)) per query row. The probabilities are rebuilt tile by tile
from Q, K and the saved LSE (base 2, as the forward keeps it), P = 2^{S·scale·log2(e) − LSE}, and

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − delta),   dK = scale · dSᵀ Q,   dQ = scale · dS K

i.e. five matmuls (10·N²·d FLOPs per head, against 8·N²·d if P had been stored). Two schedules:

- two-pass (deterministic): two passes without atomics. First one program per query block
  accumulates dQ over all key blocks (and writes its rows' delta), then one per key block
  accumulates dK and dV over all query blocks (and over the query heads of its GQA group). Each
  pass recomputes S and dP: 7 matmuls, the price of determinism.
- fused (FA2's original schedule): the key-block programs also compute their share scale · dS K
  of each query block's dQ and add it into a zeroed float32 (B, H, N, d) buffer, cast to the
  input dtype at the end: 5 matmuls, but the order of the adds, hence dQ's last bits, depends on
  scheduling. On Hopper each share goes as one TMA bulk reduce-add of the tile (TMA_DQ, as in
  FlashAttention-3), elsewhere as per-element float32 atomics.

Kernels: bwd_dq_kernel (two-pass: dQ and delta), then bwd_kv_kernel (one key block's dK, dV);
fused: bwd_preprocess_kernel (delta), then bwd_kv_kernel with ATOMIC_DQ (dK, dV and dQ shares).

Masks (tiles.py) skip tiles as in the forward: a key-block program visits only the query blocks
that see one of its keys (a masked head, a fully visible middle, a masked tail under a window),
a query-block program only the key blocks its rows see; masked elements get P = 0.
"""
import triton
import triton.language as tl

from kernels.flash_attn.tiles import (
    doc_ids,
    doc_range,
    dot_acc,
    key_bounds,
    load_rows,
    mma_operand,
    positions_visible,
    row_source,
    tile_range,
)


@triton.jit
def bwd_preprocess_kernel(
    O, DO, DELTA,  # noqa: E741  (O: the output, named as in the equations)
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    heads_q, seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta_i = Σ_d dO_id · O_id, the row term of dS = P ∘ (dP − delta)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od, mask=ok, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod, mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + (b * heads_q + h) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _bwd_kv_inner(
    dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_base,
    stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
    offs_n, offs_m0, offs_d, lo, hi, seqlen_q, seqlen_k, offset, qk_scale, softmax_scale,
    win_left, win_right, doc_base, doc_k, TILES,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr, COUNT_TILES: tl.constexpr,
    ELEM: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, TMA_DQ: tl.constexpr,
):
    """dV += Pᵀ dO and dK += dSᵀ Q (unscaled) over the query blocks [lo, hi) of one head.
    MASKED: the positional mask; DOCS: the document mask."""
    d_ok = offs_d[None, :] < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        if COUNT_TILES:
            tl.atomic_add(TILES, 1)
        rows = start_m + offs_m0
        row_ok = rows < seqlen_q
        q = mma_operand(load_rows(q_src, start_m, offs_m0, offs_d, seqlen_q, stride_qn, stride_qd, HEAD_DIM, TMA), ELEM, UPCAST)
        # rows past the end get LSE = +inf, hence P = 0: no score mask needed for them
        lse2 = tl.load(lse_base + rows, mask=row_ok, other=float("inf"))
        # recompute Pᵀ (BLOCK_N, BLOCK_M) from Q, K and the saved LSE
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale - lse2[None, :])
        if MASKED:
            keep = positions_visible(rows[None, :], offs_n[:, None], seqlen_k, offset, win_left, win_right, CAUSAL, WINDOW)
            p_t = tl.where(keep, p_t, 0.0)
        if DOCS:
            p_t = tl.where(doc_k[:, None] == doc_ids(doc_base, rows, seqlen_q)[None, :], p_t, 0.0)
        do = mma_operand(load_rows(do_src, start_m, offs_m0, offs_d, seqlen_q, stride_don, stride_dod, HEAD_DIM, TMA), ELEM, UPCAST)
        dv = dot_acc(mma_operand(p_t, ELEM, UPCAST), do, dv, DOT_PRECISION)
        delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = mma_operand(p_t * (dp_t - delta[None, :]), ELEM, UPCAST)
        dk = dot_acc(ds_t, q, dk, DOT_PRECISION)
        if ATOMIC_DQ:
            # the fused schedule's fifth matmul: this key block's share of dQ = scale · dS K for these
            # rows (BLOCK_M, BLOCK_D), added in float32 to what the other key blocks' programs add.
            # Relaxed: the sum is read only after the kernel ends, so no ordering is needed between adds.
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION) * softmax_scale
            if TMA_DQ:
                # one bulk reduce-add of the whole tile by the copy engine (FlashAttention-3's way):
                # no per-element atomics in the registers; rows past seqlen_q are clipped by TMA
                dq_base.atomic_add([start_m, 0], dq)
            else:
                tl.atomic_add(dq_base + rows[:, None] * stride_dqn + offs_d[None, :] * stride_dqd, dq,
                              mask=row_ok[:, None] & d_ok, sem="relaxed")
    return dk, dv


@triton.jit
def bwd_kv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    win_left, win_right, DOC, stride_docb, DOC_RANGE, TILES,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr, COUNT_TILES: tl.constexpr,
    REVERSE: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA_DQ: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """One key block's dK and dV. ATOMIC_DQ=False: the deterministic schedule's first pass (DQ and
    its strides are unused, None). ATOMIC_DQ=True: the fused schedule, which also adds the block's
    dQ share into the zeroed float32 buffer DQ. Masks as fwd_kernel's, DOC_RANGE per key block
    (the query range of its documents and its own document's run)."""
    pid_n = tl.program_id(0)  # grid (key blocks, kv heads, batch)
    if REVERSE:
        pid_n = tl.num_programs(0) - 1 - pid_n
    start_n = pid_n * BLOCK_N
    kvh = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    ELEM: tl.constexpr = Q.dtype.element_ty
    offset = seqlen_k - seqlen_q

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    # this key block's K and V stay on chip while every query block streams past
    k = tl.load(K + b * stride_kb + kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_ok, other=0.0)
    v = tl.load(V + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_ok, other=0.0)
    k = mma_operand(k, ELEM, UPCAST)
    v = mma_operand(v, ELEM, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    doc_base = DOC
    doc_k = offs_n
    if DOCS:
        doc_base = DOC + b * stride_docb
        doc_k = doc_ids(doc_base, offs_n, seqlen_k)
    if WINDOW:  # query rows r see keys [r + offset − left, r + offset + right]: key j is seen by rows [j − offset − right, j − offset + left]
        lo, full_lo, full_hi, hi = tile_range(start_n, BLOCK_N, BLOCK_M, seqlen_q, -offset, win_right, win_left)
    elif CAUSAL:
        # first query row that sees key start_n, and first that sees the whole block
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.minimum(tl.maximum(lo, tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M), seqlen_q)
        full_hi = seqlen_q
        hi = seqlen_q
    else:
        lo = 0
        full_lo = 0
        full_hi = seqlen_q
        hi = seqlen_q
    pure_lo = full_lo
    pure_hi = full_hi
    if DOCS:  # only the query blocks of this block's documents
        lo, full_lo, pure_lo, pure_hi, full_hi, hi = doc_range(DOC_RANGE, b * tl.num_programs(0) + pid_n, lo, full_lo, full_hi, hi)
    # dK, dV sum over the query heads that share this kv head. This loop is never software-pipelined
    # (num_stages=1): at seqlen_q == 1, which Triton compiles as a constant, the one-trip query
    # loops fold away and leave it innermost, and the pipeliner cannot predicate the TMA
    # descriptors it builds. (do_not_specialize on seqlen_q also avoids that, but slowed the
    # backward by losing seqlen_q's divisibility by 16.)
    for g in tl.range(0, group, num_stages=1):
        h = kvh * group + g
        q_src = row_source(Q + b * stride_qb + h * stride_qh, seqlen_q, stride_qn, stride_qd, BLOCK_M, BLOCK_D, HEAD_DIM, TMA)
        do_src = row_source(DO + b * stride_dob + h * stride_doh, seqlen_q, stride_don, stride_dod, BLOCK_M, BLOCK_D, HEAD_DIM, TMA)
        if ATOMIC_DQ:  # where this head's dQ shares go: a descriptor (TMA_DQ) or a pointer
            dq_base = row_source(DQ + b * stride_dqb + h * stride_dqh, seqlen_q, stride_dqn, stride_dqd,
                                 BLOCK_M, BLOCK_D, HEAD_DIM, TMA_DQ)
        else:
            dq_base = DQ
        row_base = (b * heads_q + h) * seqlen_q
        # the diagonal query blocks (causal, the window's head: masked), those that see the whole
        # key block, and the window's tail (masked)
        dk, dv = _bwd_kv_inner(
            dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
            stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
            offs_n, offs_m0, offs_d, lo, full_lo, seqlen_q, seqlen_k, offset, qk_scale, softmax_scale,
            win_left, win_right, doc_base, doc_k, TILES,
            HEAD_DIM, BLOCK_M, True, ATOMIC_DQ, CAUSAL, WINDOW, DOCS, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA, TMA_DQ,
        )
        # with documents, the document mask only outside the run of this block's own document
        if DOCS:
            dk, dv = _bwd_kv_inner(
                dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
                stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                offs_n, offs_m0, offs_d, full_lo, pure_lo, seqlen_q, seqlen_k, offset, qk_scale, softmax_scale,
                win_left, win_right, doc_base, doc_k, TILES,
                HEAD_DIM, BLOCK_M, False, ATOMIC_DQ, CAUSAL, WINDOW, True, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA, TMA_DQ,
            )
        dk, dv = _bwd_kv_inner(
            dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
            stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
            offs_n, offs_m0, offs_d, pure_lo, pure_hi, seqlen_q, seqlen_k, offset, qk_scale, softmax_scale,
            win_left, win_right, doc_base, doc_k, TILES,
            HEAD_DIM, BLOCK_M, False, ATOMIC_DQ, CAUSAL, WINDOW, False, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA, TMA_DQ,
        )
        if DOCS:
            dk, dv = _bwd_kv_inner(
                dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
                stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                offs_n, offs_m0, offs_d, pure_hi, full_hi, seqlen_q, seqlen_k, offset, qk_scale, softmax_scale,
                win_left, win_right, doc_base, doc_k, TILES,
                HEAD_DIM, BLOCK_M, False, ATOMIC_DQ, CAUSAL, WINDOW, True, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA, TMA_DQ,
            )
        if WINDOW:
            dk, dv = _bwd_kv_inner(
                dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
                stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                offs_n, offs_m0, offs_d, full_hi, hi, seqlen_q, seqlen_k, offset, qk_scale, softmax_scale,
                win_left, win_right, doc_base, doc_k, TILES,
                HEAD_DIM, BLOCK_M, True, ATOMIC_DQ, CAUSAL, WINDOW, DOCS, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA, TMA_DQ,
            )
    dk = dk * softmax_scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             mma_operand(dk, ELEM, UPCAST).to(ELEM), mask=kv_ok)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             mma_operand(dv, ELEM, UPCAST).to(ELEM), mask=kv_ok)


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_n0, offs_d, lo, hi, seqlen_k, offset, qk_scale,
    win_left, win_right, doc_base, doc_q, TILES,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr, DOCS: tl.constexpr, COUNT_TILES: tl.constexpr,
    ELEM: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """dQ += dS K (unscaled) over the key blocks [lo, hi); masks as in _fwd_inner."""
    for start_n in range(lo, hi, BLOCK_N):
        if COUNT_TILES:
            tl.atomic_add(TILES, 1)
        cols = start_n + offs_n0
        k = mma_operand(load_rows(k_src, start_n, offs_n0, offs_d, seqlen_k, stride_kn, stride_kd, HEAD_DIM, TMA), ELEM, UPCAST)
        v = mma_operand(load_rows(v_src, start_n, offs_n0, offs_d, seqlen_k, stride_vn, stride_vd, HEAD_DIM, TMA), ELEM, UPCAST)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale - lse2[:, None])
        if MASKED:
            keep = positions_visible(offs_m[:, None], cols[None, :], seqlen_k, offset, win_left, win_right, CAUSAL, WINDOW)
            p = tl.where(keep, p, 0.0)
        if DOCS:
            p = tl.where(doc_q[:, None] == doc_ids(doc_base, cols, seqlen_k)[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = dot_acc(mma_operand(ds, ELEM, UPCAST), k, dq, DOT_PRECISION)
    return dq


@triton.jit
def bwd_dq_kernel(
    Q, K, V, O, DO, LSE, DELTA, DQ,  # noqa: E741
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    win_left, win_right, DOC, stride_docb, DOC_RANGE, TILES,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr, COUNT_TILES: tl.constexpr,
    REVERSE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """One query block's dQ, and its rows' delta = rowsum(dO ∘ O), written to DELTA for the dK/dV
    pass that follows: the deterministic schedule's first pass. Computing delta here, from the
    O tile the program reads once, saves the separate preprocess launch (host time that shows
    at short sequences). Masks as fwd_kernel's."""
    pid_m = tl.program_id(0)  # grid (query blocks, heads, batch)
    if REVERSE:  # longest (causal: last) query blocks first, as in the forward
        pid_m = tl.num_programs(0) - 1 - pid_m
    start_m = pid_m * BLOCK_M
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    kvh = h // group
    row0 = (b * heads_q + h) * seqlen_q
    ELEM: tl.constexpr = Q.dtype.element_ty
    offset = seqlen_k - seqlen_q

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen_q
    q_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd, mask=q_ok, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod, mask=q_ok, other=0.0)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od, mask=q_ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + row0 + offs_m, delta, mask=row_ok)
    q = mma_operand(q, ELEM, UPCAST)  # q and dO stay on chip while the key blocks stream past
    do = mma_operand(do, ELEM, UPCAST)
    lse2 = tl.load(LSE + row0 + offs_m, mask=row_ok, other=float("inf"))
    k_src = row_source(K + b * stride_kb + kvh * stride_kh, seqlen_k, stride_kn, stride_kd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)
    v_src = row_source(V + b * stride_vb + kvh * stride_vh, seqlen_k, stride_vn, stride_vd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    doc_base = DOC
    doc_q = offs_m
    if DOCS:
        doc_base = DOC + b * stride_docb
        doc_q = doc_ids(doc_base, offs_m, seqlen_q)
    lo, full_lo, pure_lo, pure_hi, full_end, hi = key_bounds(start_m, BLOCK_M, BLOCK_N, seqlen_k, offset, win_left, win_right,
                                                             DOC_RANGE, b * tl.num_programs(0) + pid_m, CAUSAL, WINDOW, DOCS)
    if WINDOW:
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_n0, offs_d, lo, full_lo, seqlen_k, offset, qk_scale,
            win_left, win_right, doc_base, doc_q, TILES,
            HEAD_DIM, BLOCK_N, True, CAUSAL, WINDOW, DOCS, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    if DOCS:  # the document mask only outside the run of this block's own document
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_n0, offs_d, full_lo, pure_lo, seqlen_k, offset, qk_scale,
            win_left, win_right, doc_base, doc_q, TILES,
            HEAD_DIM, BLOCK_N, False, CAUSAL, WINDOW, True, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n0, offs_d, pure_lo, pure_hi, seqlen_k, offset, qk_scale,
        win_left, win_right, doc_base, doc_q, TILES,
        HEAD_DIM, BLOCK_N, False, CAUSAL, WINDOW, False, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
    )
    if DOCS:
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_n0, offs_d, pure_hi, full_end, seqlen_k, offset, qk_scale,
            win_left, win_right, doc_base, doc_q, TILES,
            HEAD_DIM, BLOCK_N, False, CAUSAL, WINDOW, True, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n0, offs_d, full_end, hi, seqlen_k, offset, qk_scale,
        win_left, win_right, doc_base, doc_q, TILES,
        HEAD_DIM, BLOCK_N, True, CAUSAL, WINDOW, DOCS, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
    )
    dq = dq * softmax_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd,
             mma_operand(dq, ELEM, UPCAST).to(ELEM), mask=q_ok)
