"""The forward kernel (FlashAttention-2, Dao 2023, Algorithm 1).

One program owns a block of BLOCK_M query rows, which stays in SRAM/registers while blocks of
BLOCK_N keys and values stream past. Per row it keeps the running max m, the running sum
l = Σ_j e^{s_j − m} and the unnormalised output o. For each key block with scores s
(BLOCK_M × BLOCK_N):

    m_new = max(m, rowmax(s))
    α     = e^{m − m_new}               (rescales what was summed under the old max)
    p     = e^{s − m_new}
    l     = α·l + rowsum(p)
    o     = α·o + p V

and at the end O = o / l and LSE = m + log l (the row's log-sum-exp), the only two things
written. Exponentials are exp2 with log2(e)·scale folded into the scores, so m and the saved
LSE are in base 2 (log2 of the sum); the public flash_attn_forward converts to the natural log.

Masks (tiles.py): a program visits only the key blocks its rows can see. Under a sliding window
they form a masked head, a middle every row sees in full, and a masked tail; under the causal
mask the head is empty; with documents the range shrinks to the blocks of the rows' documents,
and the document mask is applied only to tiles that mix documents.
"""
import triton
import triton.language as tl

from kernels.flash_attn.tiles import (
    doc_ids,
    key_bounds,
    load_rows,
    mma_operand,
    positions_visible,
    row_source,
)


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_n, offs_d, lo, hi, seqlen_k, offset, qk_scale,
    win_left, win_right, doc_base, doc_q, TILES,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr, DOCS: tl.constexpr, COUNT_TILES: tl.constexpr,
    ELEM: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """The online-softmax update above, over the key blocks [lo, hi). MASKED: apply the
    positional mask (the blocks of the head and tail); DOCS: the document mask."""
    for start_n in range(lo, hi, BLOCK_N):
        if COUNT_TILES:
            tl.atomic_add(TILES, 1)
        cols = start_n + offs_n
        k = mma_operand(load_rows(k_src, start_n, offs_n, offs_d, seqlen_k, stride_kn, stride_kd, HEAD_DIM, TMA), ELEM, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) raw scores
        if MASKED:
            keep = positions_visible(offs_m[:, None], cols[None, :], seqlen_k, offset, win_left, win_right, CAUSAL, WINDOW)
            s = tl.where(keep, s, float("-inf"))
        if DOCS:
            s = tl.where(doc_q[:, None] == doc_ids(doc_base, cols, seqlen_k)[None, :], s, float("-inf"))
        # m is kept in base-2 units: e^{scale·s} = exp2(log2(e)·scale·s), so p is one FMA + exp2
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_sub = m_new
        if MASKED or DOCS:
            # a row that has seen no key yet keeps m = -inf; subtract 0 so e^{-inf - (-inf)} never appears
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = mma_operand(load_rows(v_src, start_n, offs_n, offs_d, seqlen_k, stride_vn, stride_vd, HEAD_DIM, TMA), ELEM, UPCAST)
        acc = acc * alpha[:, None]
        acc = tl.dot(mma_operand(p, ELEM, UPCAST), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def fwd_kernel(
    Q, K, V, O, LSE,  # noqa: E741  (O: the output, named as in the equations)
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    heads_q, group, seqlen_q, seqlen_k, qk_scale,
    win_left, win_right, DOC, stride_docb, DOC_RANGE, TILES,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr, COUNT_TILES: tl.constexpr,
    REVERSE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """One query block's output rows and LSE. Masks: WINDOW (win_left/win_right, causal folded
    in), DOCS (DOC: int32 ids (batch, seqlen); DOC_RANGE: int32 (batch, query blocks, 4), the key
    range of each block's documents and its own document's run); TILES: a counter of visited key blocks (tests), if COUNT_TILES."""
    # grid (query blocks, heads, batch): the blocks of one head run together, so its K/V stay in L2
    pid_m = tl.program_id(0)
    if REVERSE:  # causal: the last query blocks see the most keys; launching them first shortens the tail
        pid_m = tl.num_programs(0) - 1 - pid_m
    start_m = pid_m * BLOCK_M
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    kvh = h // group  # GQA: query head h reads kv head h // (heads_q / heads_kv)
    row0 = (b * heads_q + h) * seqlen_q  # this head's rows in LSE
    ELEM: tl.constexpr = Q.dtype.element_ty
    offset = seqlen_k - seqlen_q  # bottom-right causal alignment

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = mma_operand(tl.load(q_ptrs, mask=q_ok, other=0.0), ELEM, UPCAST)  # stays on chip for the whole loop
    k_src = row_source(K + b * stride_kb + kvh * stride_kh, seqlen_k, stride_kn, stride_kd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)
    v_src = row_source(V + b * stride_vb + kvh * stride_vh, seqlen_k, stride_vn, stride_vd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    doc_base = DOC
    doc_q = offs_m
    if DOCS:
        doc_base = DOC + b * stride_docb
        doc_q = doc_ids(doc_base, offs_m, seqlen_q)
    lo, full_lo, pure_lo, pure_hi, full_end, hi = key_bounds(start_m, BLOCK_M, BLOCK_N, seqlen_k, offset, win_left, win_right,
                                                             DOC_RANGE, b * tl.num_programs(0) + pid_m, CAUSAL, WINDOW, DOCS)
    if WINDOW:
        # the window's head: key blocks left of those every row sees
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_n, offs_d, lo, full_lo, seqlen_k, offset, qk_scale,
            win_left, win_right, doc_base, doc_q, TILES,
            HEAD_DIM, BLOCK_N, True, CAUSAL, WINDOW, DOCS, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    # key blocks every row sees in full: no positional mask arithmetic at all; with documents the
    # document mask only outside the run of tiles of the block's own document, [pure_lo, pure_hi)
    if DOCS:
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_n, offs_d, full_lo, pure_lo, seqlen_k, offset, qk_scale,
            win_left, win_right, doc_base, doc_q, TILES,
            HEAD_DIM, BLOCK_N, False, CAUSAL, WINDOW, True, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n, offs_d, pure_lo, pure_hi, seqlen_k, offset, qk_scale,
        win_left, win_right, doc_base, doc_q, TILES,
        HEAD_DIM, BLOCK_N, False, CAUSAL, WINDOW, False, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
    )
    if DOCS:
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_n, offs_d, pure_hi, full_end, seqlen_k, offset, qk_scale,
            win_left, win_right, doc_base, doc_q, TILES,
            HEAD_DIM, BLOCK_N, False, CAUSAL, WINDOW, True, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    # the diagonal blocks (causal; the window's tail) and the ragged last block; blocks beyond are skipped
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n, offs_d, full_end, hi, seqlen_k, offset, qk_scale,
        win_left, win_right, doc_base, doc_q, TILES,
        HEAD_DIM, BLOCK_N, True, CAUSAL, WINDOW, DOCS, COUNT_TILES, ELEM, UPCAST, DOT_PRECISION, TMA,
    )

    if CAUSAL or WINDOW:
        # rows that see no key (causal with seqlen_q > seqlen_k, a window past either end): output
        # 0/1 = 0 and LSE = +inf (so the backward's P = e^{S - LSE} is 0). Decided by position, not
        # by l == 0: a row whose every score is -inf (a -inf input) also ends with l = 0 and must
        # give 0/0 = NaN, as softmax does. (Documents empty no row: a row always sees its own key.)
        if WINDOW:
            # (rows past seqlen_q too: not stored, but this keeps their 0/0 out of the arithmetic)
            empty = (offs_m + offset + win_right < 0) | (offs_m + offset - win_left >= seqlen_k) | (offs_m >= seqlen_q)
        else:
            empty = offs_m + offset < 0
        l_i = tl.where(empty, 1.0, l_i)
        m_i = tl.where(empty, float("inf"), m_i)
    acc = acc / l_i[:, None]
    # the log-sum-exp stays in base 2 (m's units): the backward's exp2(s·qk_scale − lse2) then
    # repeats the forward's arithmetic, without a round trip through the natural log
    lse2 = m_i + tl.math.log2(l_i)
    tl.store(LSE + row0 + offs_m, lse2, mask=offs_m < seqlen_q)
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, mma_operand(acc, ELEM, UPCAST).to(ELEM), mask=q_ok)
