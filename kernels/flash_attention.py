"""FlashAttention-2 in Triton: exact softmax(Q Kᵀ · scale) V without the N×N matrix.

Forward (FlashAttention-2, Dao 2023, Algorithm 1). One program owns a block of BLOCK_M query
rows, which stays in SRAM/registers while blocks of BLOCK_N keys and values stream past. Per row
it keeps the running max m, the running sum l = Σ_j e^{s_j − m} and the unnormalised output o.
For each key block with scores s (BLOCK_M × BLOCK_N):

    m_new = max(m, rowmax(s))
    α     = e^{m − m_new}               (rescales what was summed under the old max)
    p     = e^{s − m_new}
    l     = α·l + rowsum(p)
    o     = α·o + p V

and at the end O = o / l and LSE = m + log l (the row's log-sum-exp), the only two things
written. Exponentials are exp2 with log2(e)·scale folded into the scores.

Backward (Algorithm 2, with recomputation). First delta = rowsum(dO ∘ O) (= rowsum(P ∘ dP)).
Then the probabilities are rebuilt tile by tile from Q, K and the saved LSE,
P = e^{S − LSE}, and

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − delta),   dK = scale · dSᵀ Q,   dQ = scale · dS K

i.e. five matmuls (10·N²·d FLOPs per head, against 8·N²·d if P had been stored). Two schedules:

- deterministic (default): two passes without atomics. One program per key block accumulates dK
  and dV over all query blocks (and over the query heads of its GQA group), another per query
  block accumulates dQ over all key blocks. Each pass recomputes S and dP: 7 matmuls, the price
  of determinism.
- fused (deterministic=False, FA2's original schedule): the key-block programs also compute
  their share scale · dS K of each query block's dQ and add it with float32 atomics into a
  zeroed (B, H, N, d) buffer, cast to the input dtype at the end: 5 matmuls, but the order of
  the adds, hence dQ's last bits, depends on scheduling.

Loads: the tiles an inner loop streams (K, V past a query block; Q, dO past a key block) come
either through masked pointer loads or, where the config table measured it faster (the dQ pass;
the dK/dV pass at d=128) and the layout allows, through TMA tensor descriptors (Hopper's copy
engine, which zero-fills past the sequence and the head dim just as the masks do).

Under the causal mask the programs differ in length; REVERSE in the launch config starts the
longest first (the last query blocks; the key-block kernels already start at theirs).

Conventions: inputs in SDPA layout (batch, heads, seqlen, head_dim), any strides. Causal masks
align bottom-right: query i sees keys j <= i + seqlen_k − seqlen_q (flash-attn's convention). A
row that sees no key outputs zeros, has LSE = +inf, and gets zero gradients. NaN/Inf inputs are not
cleaned: a row whose scores hold a NaN or +inf, or are all −inf, comes out NaN as in softmax. Head
dims that are not powers of two are padded inside the kernel with masked loads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Iterator

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from kernels.flops import attention_flops

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _mma_operand(x, ELEM: tl.constexpr, UPCAST: tl.constexpr):
    """Round x to the input dtype, as the tensor cores will see it.

    UPCAST is set only when the CPU interpreter runs bf16: its tl.dot on bf16 multiplies raw bits
    and its float32 -> bfloat16 cast truncates, so there we round to nearest-even by hand and keep
    the (exactly representable) result in float32."""
    if UPCAST:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(ELEM)


@triton.jit
def _causal_bounds(start, BLOCK: tl.constexpr, BLOCK_OTHER: tl.constexpr, seqlen_k, offset, CAUSAL: tl.constexpr):
    """Key range for the query rows [start, start + BLOCK): keys below `full_end` are visible to
    every row and in range (no mask needed); keys in [full_end, hi) need the mask."""
    if CAUSAL:
        hi = tl.minimum(seqlen_k, start + BLOCK + offset)
        full_end = tl.minimum(seqlen_k, start + offset + 1)
    else:
        hi = seqlen_k
        full_end = seqlen_k
    hi = tl.maximum(hi, 0)
    full_end = tl.maximum(full_end, 0) // BLOCK_OTHER * BLOCK_OTHER
    return full_end, hi


@triton.jit
def _row_source(base, seqlen, stride_n, stride_d, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
                HEAD_DIM: tl.constexpr, TMA: tl.constexpr):
    """What an inner loop streams (BLOCK, BLOCK_D) row tiles of one head from.

    With TMA, a tensor descriptor over the head's (seqlen, HEAD_DIM) rows: Hopper's copy engine
    then moves each tile to shared memory, with no per-element address or mask arithmetic in the
    registers, and fills rows past seqlen and columns past HEAD_DIM with zeros. Without, the head's
    base pointer, for masked loads (_load_rows)."""
    if TMA:
        return tl.make_tensor_descriptor(base, shape=[seqlen, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK, BLOCK_D])
    else:
        return base


@triton.jit
def _load_rows(src, start, offs_r, offs_d, seqlen, stride_n, stride_d, HEAD_DIM: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + len(offs_r)) of a _row_source, zero past seqlen and past HEAD_DIM."""
    if TMA:
        return src.load([start, 0])
    else:
        rows = start + offs_r
        ok = (rows[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM)
        return tl.load(src + rows[:, None] * stride_n + offs_d[None, :] * stride_d, mask=ok, other=0.0)


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_n, offs_d, lo, hi, seqlen_k, offset, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    ELEM: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _mma_operand(_load_rows(k_src, start_n, offs_n, offs_d, seqlen_k, stride_kn, stride_kd, HEAD_DIM, TMA), ELEM, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) raw scores
        if MASKED:
            keep = cols[None, :] < seqlen_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + offset)
            s = tl.where(keep, s, float("-inf"))
        # m is kept in base-2 units: e^{scale·s} = exp2(log2(e)·scale·s), so p is one FMA + exp2
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_sub = m_new
        if MASKED:
            # a row that has seen no key yet keeps m = -inf; subtract 0 so e^{-inf - (-inf)} never appears
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _mma_operand(_load_rows(v_src, start_n, offs_n, offs_d, seqlen_k, stride_vn, stride_vd, HEAD_DIM, TMA), ELEM, UPCAST)
        acc = acc * alpha[:, None]
        acc = tl.dot(_mma_operand(p, ELEM, UPCAST), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    heads_q, group, seqlen_q, seqlen_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, REVERSE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
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
    q = _mma_operand(tl.load(q_ptrs, mask=q_ok, other=0.0), ELEM, UPCAST)  # stays on chip for the whole loop
    k_src = _row_source(K + b * stride_kb + kvh * stride_kh, seqlen_k, stride_kn, stride_kd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)
    v_src = _row_source(V + b * stride_vb + kvh * stride_vh, seqlen_k, stride_vn, stride_vd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full_end, hi = _causal_bounds(start_m, BLOCK_M, BLOCK_N, seqlen_k, offset, CAUSAL)
    # key blocks every row sees in full: no mask arithmetic at all
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n, offs_d, 0, full_end, seqlen_k, offset, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, ELEM, UPCAST, DOT_PRECISION, TMA,
    )
    # the diagonal blocks (causal) and the ragged last block; blocks above the diagonal are skipped
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n, offs_d, full_end, hi, seqlen_k, offset, qk_scale,
        HEAD_DIM, BLOCK_N, True, CAUSAL, ELEM, UPCAST, DOT_PRECISION, TMA,
    )

    if CAUSAL:
        # rows that see no key (seqlen_q > seqlen_k): output 0/1 = 0 and LSE = +inf (so the
        # backward's P = e^{S - LSE} is 0). Decided by position, not by l == 0: a row whose every
        # score is -inf (a -inf input) also ends with l = 0 and must give 0/0 = NaN, as softmax does.
        empty = offs_m + offset < 0
        l_i = tl.where(empty, 1.0, l_i)
        m_i = tl.where(empty, float("inf"), m_i)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + row0 + offs_m, lse, mask=offs_m < seqlen_q)
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, _mma_operand(acc, ELEM, UPCAST).to(ELEM), mask=q_ok)


@triton.jit
def _bwd_preprocess_kernel(
    O, DO, DELTA,
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
    offs_n, offs_m0, offs_d, lo, hi, seqlen_q, offset, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    ELEM: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    d_ok = offs_d[None, :] < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m0
        row_ok = rows < seqlen_q
        q = _mma_operand(_load_rows(q_src, start_m, offs_m0, offs_d, seqlen_q, stride_qn, stride_qd, HEAD_DIM, TMA), ELEM, UPCAST)
        # rows past the end get LSE = +inf, hence P = 0: no score mask needed for them
        lse2 = tl.load(lse_base + rows, mask=row_ok, other=float("inf")) * 1.4426950408889634
        # recompute Pᵀ (BLOCK_N, BLOCK_M) from Q, K and the saved LSE
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= rows[None, :] + offset, p_t, 0.0)
        do = _mma_operand(_load_rows(do_src, start_m, offs_m0, offs_d, seqlen_q, stride_don, stride_dod, HEAD_DIM, TMA), ELEM, UPCAST)
        dv = tl.dot(_mma_operand(p_t, ELEM, UPCAST), do, dv, input_precision=DOT_PRECISION)
        delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = _mma_operand(p_t * (dp_t - delta[None, :]), ELEM, UPCAST)
        dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
        if ATOMIC_DQ:
            # the fused schedule's fifth matmul: this key block's share of dQ = scale · dS K for these
            # rows (BLOCK_M, BLOCK_D), added in float32 to what the other key blocks' programs add.
            # Relaxed: the sum is read only after the kernel ends, so no ordering is needed between adds.
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION) * softmax_scale
            tl.atomic_add(dq_base + rows[:, None] * stride_dqn + offs_d[None, :] * stride_dqd, dq,
                          mask=row_ok[:, None] & d_ok, sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_kv_program(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, REVERSE: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """One key block's dK and dV (and, with ATOMIC_DQ, its dQ share): the body of both kernels below."""
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
    k = _mma_operand(k, ELEM, UPCAST)
    v = _mma_operand(v, ELEM, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        # first query row that sees key start_n, and first that sees the whole block
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        full_start = tl.maximum(lo, tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M)
    else:
        lo = 0
        full_start = 0
    for g in range(0, group):  # dK, dV sum over the query heads that share this kv head
        h = kvh * group + g
        q_src = _row_source(Q + b * stride_qb + h * stride_qh, seqlen_q, stride_qn, stride_qd, BLOCK_M, BLOCK_D, HEAD_DIM, TMA)
        do_src = _row_source(DO + b * stride_dob + h * stride_doh, seqlen_q, stride_don, stride_dod, BLOCK_M, BLOCK_D, HEAD_DIM, TMA)
        dq_base = DQ + b * stride_dqb + h * stride_dqh
        row_base = (b * heads_q + h) * seqlen_q
        dk, dv = _bwd_kv_inner(
            dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
            stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
            offs_n, offs_m0, offs_d, lo, tl.minimum(full_start, seqlen_q), seqlen_q, offset, qk_scale, softmax_scale,
            HEAD_DIM, BLOCK_M, True, ATOMIC_DQ, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
        dk, dv = _bwd_kv_inner(
            dk, dv, k, v, q_src, do_src, LSE + row_base, DELTA + row_base, dq_base,
            stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
            offs_n, offs_m0, offs_d, full_start, seqlen_q, seqlen_q, offset, qk_scale, softmax_scale,
            HEAD_DIM, BLOCK_M, False, ATOMIC_DQ, ELEM, UPCAST, DOT_PRECISION, TMA,
        )
    dk = dk * softmax_scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             _mma_operand(dk, ELEM, UPCAST).to(ELEM), mask=kv_ok)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             _mma_operand(dv, ELEM, UPCAST).to(ELEM), mask=kv_ok)


# seqlen_q stays a run-time value in the key-block kernels: Triton would otherwise compile
# seqlen_q == 1 as a constant, fold the one-trip query loop away and leave the GQA loop, which
# builds the TMA descriptors, as the innermost loop, which its pipeliner cannot compile.
@triton.jit(do_not_specialize=["seqlen_q"])
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, REVERSE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Deterministic pass 1: dK, dV only (DK stands in for the unused dQ pointer)."""
    _bwd_kv_program(
        Q, K, V, DO, LSE, DELTA, DK, DV, DK,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_don, stride_dod,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        0, 0, 0, 0,
        heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, REVERSE, False, UPCAST, DOT_PRECISION, TMA,
    )


@triton.jit(do_not_specialize=["seqlen_q"])  # as _bwd_dkdv_kernel
def _bwd_fused_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, REVERSE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Single-pass backward: dK, dV as above, dQ atomically added into the float32 buffer DQ (zeroed)."""
    _bwd_kv_program(
        Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_don, stride_dod,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        stride_dqb, stride_dqh, stride_dqn, stride_dqd,
        heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, REVERSE, True, UPCAST, DOT_PRECISION, TMA,
    )


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_n0, offs_d, lo, hi, seqlen_k, offset, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    ELEM: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n0
        k = _mma_operand(_load_rows(k_src, start_n, offs_n0, offs_d, seqlen_k, stride_kn, stride_kd, HEAD_DIM, TMA), ELEM, UPCAST)
        v = _mma_operand(_load_rows(v_src, start_n, offs_n0, offs_d, seqlen_k, stride_vn, stride_vd, HEAD_DIM, TMA), ELEM, UPCAST)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale - lse2[:, None])
        if MASKED:
            keep = cols[None, :] < seqlen_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + offset)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(_mma_operand(ds, ELEM, UPCAST), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    heads_q, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, REVERSE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
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
    q = _mma_operand(q, ELEM, UPCAST)
    do = _mma_operand(do, ELEM, UPCAST)
    lse2 = tl.load(LSE + row0 + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    delta = tl.load(DELTA + row0 + offs_m, mask=row_ok, other=0.0)
    k_src = _row_source(K + b * stride_kb + kvh * stride_kh, seqlen_k, stride_kn, stride_kd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)
    v_src = _row_source(V + b * stride_vb + kvh * stride_vh, seqlen_k, stride_vn, stride_vd, BLOCK_N, BLOCK_D, HEAD_DIM, TMA)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full_end, hi = _causal_bounds(start_m, BLOCK_M, BLOCK_N, seqlen_k, offset, CAUSAL)
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n0, offs_d, 0, full_end, seqlen_k, offset, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, ELEM, UPCAST, DOT_PRECISION, TMA,
    )
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n0, offs_d, full_end, hi, seqlen_k, offset, qk_scale,
        HEAD_DIM, BLOCK_N, True, CAUSAL, ELEM, UPCAST, DOT_PRECISION, TMA,
    )
    dq = dq * softmax_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd,
             _mma_operand(dq, ELEM, UPCAST).to(ELEM), mask=q_ok)


# ----------------------------------------------------------------------------------------------
# Launch configuration
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch knobs of one kernel (BLOCK_M query rows × BLOCK_N keys).

    REVERSE: program i takes block (number of blocks − 1 − i). The GPU starts programs roughly in
    index order, so this decides which blocks run in the last, partly idle wave; under the causal
    mask the longest should start first (the last query blocks, the first key blocks).
    TMA: the inner loop's streamed tiles come through tensor descriptors (Hopper's copy engine)
    instead of masked pointer loads; used only where the tensors allow it (_tma_ok)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2
    REVERSE: bool = False
    TMA: bool = False

    def launch_kwargs(self, *tensors: torch.Tensor) -> dict:
        """Kernel keyword arguments; TMA falls back to pointer loads when one of `tensors` (the
        ones the kernel streams through descriptors) has a layout the copy engine can't take."""
        tma = self.TMA and _tma_ok(*tensors)
        if tma:
            _ensure_allocator()
        return dict(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, REVERSE=self.REVERSE, TMA=tma,
                    num_warps=self.num_warps, num_stages=self.num_stages)


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can build a (seqlen, head_dim) tensor descriptor over every head of
    each tensor: unit stride along head_dim, 16-byte aligned head starts and rows (TMA's rules),
    and a Hopper-or-newer GPU (or the interpreter, which emulates descriptors)."""
    device = tensors[0].device  # the launchers have checked that q, k, v share one device
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or t.stride(-2) == 0:
            return False
        if any((stride * size) % 16 for stride in t.stride()[:-1]):
            return False
    return True


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # device-side descriptors live in a small global workspace that Triton asks for at launch
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Give Triton a workspace allocator for the descriptors. Triton keeps it in a ContextVar,
    i.e. per thread, and autograd runs the backward in its own thread: so set it at each launch."""
    if not interpreting():
        triton.set_allocator(_tma_scratch)


# forward, deterministic backward (dK/dV pass, dQ pass) and the single-pass atomic-dQ backward
KERNELS = ("fwd", "bwd_dkdv", "bwd_dq", "bwd_fused")
_forced: dict[str, dict[str, int]] = {}


@contextlib.contextmanager
def forced_config(kernel: str = "fwd", **fields: int) -> Iterator[None]:
    """Force launch-config fields of one kernel (one of KERNELS) inside a `with` block, e.g.
    ``forced_config("fwd", BLOCK_N=32)`` for the paper's block-size study. Fields not given keep
    the table's choice."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
    unknown = set(fields) - set(KernelConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown config fields {sorted(unknown)}; expected some of {list(KernelConfig.__dataclass_fields__)}")
    previous = _forced.get(kernel)
    _forced[kernel] = {**(previous or {}), **fields}
    try:
        yield
    finally:
        if previous is None:
            _forced.pop(kernel, None)
        else:
            _forced[kernel] = previous


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_config(kernel: str, block_d: int, dtype: torch.dtype, causal: bool) -> KernelConfig:
    """Launch config for one kernel, chosen from the padded head dim and dtype.

    One table for every caller (tests, training, benchmarks). The GPU entries are the fastest of
    scripts/tune_flash.py's sweeps on an H200 (bf16, N=8192, 16 heads, d=64 and 128, non-causal;
    docs/perf-notes.md); float32 and d=256 get smaller tiles to fit. The interpreter gets 64×64
    blocks, because its cost grows with the number of programs × key blocks, not with tile size,
    but the GPU entry's TMA setting, so that CPU tests run the load path the GPU runs.
    `causal` only sets REVERSE (longest programs first: the query-block kernels reverse where it
    measured faster, the key-block kernels already start at their longest); tiles are shared by
    both settings.
    The bwd_fused entries are the best of its first sweep (`tune_flash.py --kernels bwd_fused`,
    H200, triton 3.6, 2026-11-29: d=64 32×128 at 4.27 ms full / 2.45 causal, d=128 64×128 at 7.02
    / 3.88, all still slower than the two-pass backward's 3.72 / 2.05 / 6.85 / 3.63 ms).
    """
    wide = block_d > 64
    if kernel == "fwd":
        if dtype == torch.float32 or block_d > 128:  # wider tiles: fit shared memory
            default = KernelConfig(64, 32, num_warps=4 if block_d <= 64 else 8, num_stages=2)
        else:  # d=128: 128×128 tiles measured 2.20 vs 2.27 ms for 128×64 (H200, 2026-11-29)
            default = KernelConfig(128, 128 if wide else 64, num_warps=8, num_stages=3)
    elif dtype == torch.float32 or block_d > 128:  # fit shared memory and registers
        default = KernelConfig(32, 32, num_warps=8, num_stages=2)
    elif kernel == "bwd_dkdv":  # programs own BLOCK_N keys (dK, dV accumulators) and stream BLOCK_M queries
        # d=128: two warp groups over 128 keys with TMA loads, 3.75 ms vs 3.98 for 64×64 / 4 warps
        default = KernelConfig(64, 128, num_warps=8, num_stages=3, TMA=True) if wide else KernelConfig(32, 128, num_warps=4, num_stages=3)
    elif kernel == "bwd_fused":  # as bwd_dkdv, plus a (BLOCK_M, d) dQ tile added atomically per step
        default = KernelConfig(64, 128, num_warps=8, num_stages=3) if wide else KernelConfig(32, 128, num_warps=4, num_stages=3)
    else:  # bwd_dq: programs own BLOCK_M queries and stream BLOCK_N keys
        # TMA loads of K and V: 1.20-1.28 vs 1.37 ms at d=64, 2.53-2.60 vs 2.70-2.75 at d=128
        default = KernelConfig(128, 64, num_warps=8, num_stages=3, TMA=True)
    if interpreting():
        default = KernelConfig(64, 64, TMA=default.TMA)
    # Measured (H200, bf16, N=8192, causal, same run): REVERSE made the forward 1.4% / 0.7% faster
    # at d=64 / 128 and the dQ pass 1.2% faster at d=128 but 4.7% slower at d=64 (0.775 vs 0.740 ms).
    reverse = kernel == "fwd" or (kernel == "bwd_dq" and wide)
    default = dataclasses.replace(default, REVERSE=causal and reverse)
    return dataclasses.replace(default, **_forced.get(kernel, {}))


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs get true float32 products unless the user opted into TF32 globally
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _launch_args(q: torch.Tensor) -> dict:
    block_d = max(16, triton.next_power_of_2(q.shape[-1]))  # tl.dot needs K >= 16
    return dict(
        HEAD_DIM=q.shape[-1],
        BLOCK_D=block_d,
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        DOT_PRECISION=_dot_precision(q.dtype),
    )


def _flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    o = torch.empty_like(q)  # keeps q's memory layout, so a (B, N, H, D) view stays cheap to reshape
    lse = torch.empty((batch, heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    consts = _launch_args(q)
    cfg = kernel_config("fwd", consts["BLOCK_D"], q.dtype, causal)
    grid = (triton.cdiv(seqlen_q, cfg.BLOCK_M), heads_q, batch)
    _fwd_kernel[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E,
        CAUSAL=causal, **cfg.launch_kwargs(k, v), **consts,
    )
    return o, lse


def _bwd_preprocess(o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    batch, heads_q, seqlen_q, head_dim = o.shape
    delta = torch.empty_like(lse)
    block_m = 64
    _bwd_preprocess_kernel[(triton.cdiv(seqlen_q, block_m), heads_q, batch)](
        o, do, delta, *o.stride(), *do.stride(), heads_q, seqlen_q,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m,
    )
    return delta


def _bwd_dkdv(do, q, k, v, lse, delta, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    consts = _launch_args(q)
    cfg = kernel_config("bwd_dkdv", consts["BLOCK_D"], q.dtype, causal)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    _bwd_dkdv_kernel[(triton.cdiv(seqlen_k, cfg.BLOCK_N), heads_kv, batch)](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E, scale,
        CAUSAL=causal, **cfg.launch_kwargs(q, do), **consts,
    )
    return dk, dv


def _bwd_dq(do, q, k, v, lse, delta, causal: bool, scale: float) -> torch.Tensor:
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    consts = _launch_args(q)
    cfg = kernel_config("bwd_dq", consts["BLOCK_D"], q.dtype, causal)
    dq = torch.empty_like(q)
    _bwd_dq_kernel[(triton.cdiv(seqlen_q, cfg.BLOCK_M), heads_q, batch)](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E, scale,
        CAUSAL=causal, **cfg.launch_kwargs(k, v), **consts,
    )
    return dq


def _bwd_fused(do, q, k, v, lse, delta, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    consts = _launch_args(q)
    cfg = kernel_config("bwd_fused", consts["BLOCK_D"], q.dtype, causal)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # every key block adds its share of dQ here: float32 (exact adds of the tiles; bf16 atomics also
    # lack interpreter support), zeroed, in q's layout so the final cast keeps it
    dq_acc = torch.zeros_like(q, dtype=torch.float32)
    _bwd_fused_kernel[(triton.cdiv(seqlen_k, cfg.BLOCK_N), heads_kv, batch)](
        q, k, v, do, lse, delta, dk, dv, dq_acc,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), *dq_acc.stride(),
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E, scale,
        CAUSAL=causal, **cfg.launch_kwargs(q, do), **consts,
    )
    return dq_acc.to(q.dtype), dk, dv  # the cast is a no-op for float32 inputs


def _flash_backward(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    causal: bool, scale: float, deterministic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    delta = _bwd_preprocess(o, do, lse)
    if not deterministic:
        return _bwd_fused(do, q, k, v, lse, delta, causal, scale)
    dk, dv = _bwd_dkdv(do, q, k, v, lse, delta, causal, scale)
    dq = _bwd_dq(do, q, k, v, lse, delta, causal, scale)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# PyTorch op: custom_op (opaque to torch.compile), fake impls, autograd, FLOP formulas
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("flashgpt::flash_attn_fwd", mutates_args=())
def flash_attn_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, deterministic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` does not change the forward: it is an input here so that autograd's
    # setup_context can hand it to the backward op
    return _flash_forward(q, k, v, causal, scale)


@flash_attn_fwd.register_fake
def _(q, k, v, causal, scale, deterministic=True):
    batch, heads_q, seqlen_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flashgpt::flash_attn_bwd", mutates_args=())
def flash_attn_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    causal: bool, scale: float, deterministic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _flash_backward(do, q, k, v, o, lse, causal, scale, deterministic)


@flash_attn_bwd.register_fake
def _(do, q, k, v, o, lse, causal, scale, deterministic=True):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = flash_attn_bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None


flash_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.flashgpt.flash_attn_fwd)
def _fwd_flops(q_shape, k_shape, v_shape, causal, scale, *args, **kwargs) -> int:
    batch, heads_q, seqlen_q, head_dim = q_shape
    return attention_flops(batch, heads_q, seqlen_q, k_shape[2], head_dim, causal, "fwd")


@register_flop_formula(torch.ops.flashgpt.flash_attn_bwd)
def _bwd_flops(do_shape, q_shape, k_shape, v_shape, o_shape, lse_shape, causal, scale, *args, **kwargs) -> int:
    # the algorithm's 5 matmuls for both schedules (the two-pass one executes 7; kernels/flops.py)
    batch, heads_q, seqlen_q, head_dim = q_shape
    return attention_flops(batch, heads_q, seqlen_q, k_shape[2], head_dim, causal, "bwd")


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------


def _check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None, deterministic: bool = True,
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim) like scaled_dot_product_attention, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flash_attention supports float16, bfloat16 and float32")
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); every dimension must be >= 1")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    # meta tensors carry shapes only (FLOP counting, tracing): the op's fake impl answers, no kernel runs
    if q.device.type not in ("cuda", "meta") and not interpreting():
        raise ValueError(f"q is on {q.device}: the Triton kernel needs a CUDA device, or TRITON_INTERPRET=1 set before importing kernels to run on the CPU")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"batch sizes differ: q has {q.shape[0]}, k and v have {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"head_dim differs: q has {q.shape[3]}, k and v have {k.shape[3]}")
    if q.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim is {q.shape[3]}; flash_attention supports head_dim up to {MAX_HEAD_DIM}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q has {q.shape[1]} heads, which is not a multiple of the {k.shape[1]} heads of k and v (grouped-query attention needs heads_q % heads_kv == 0)")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None,
    deterministic: bool = True,
) -> torch.Tensor:
    """Exact attention softmax(q kᵀ · softmax_scale) v, computed tile by tile in SRAM.

    Args:
        q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim), with
            heads_q a multiple of heads_kv (query head h reads kv head h // (heads_q // heads_kv)).
            float16, bfloat16 or float32, head_dim 1..256, any strides.
        causal: mask keys after the query, aligned bottom-right when seqlen_q != seqlen_k
            (query i sees keys j <= i + seqlen_k - seqlen_q); rows that see no key give zeros.
        softmax_scale: defaults to 1 / sqrt(head_dim).
        deterministic: True (default) runs the two-pass backward, bitwise repeatable. False runs
            the single-pass backward (5 matmuls instead of 7) whose dQ is summed with float32
            atomic adds in whatever order the GPU schedules them, so dQ may differ in its last
            bits from run to run; the forward is the same either way.

    Returns:
        (batch, heads_q, seqlen_q, head_dim), in q's dtype and memory layout. Differentiable in
        q, k and v; usable under torch.compile(fullgraph=True).
    """
    _check_inputs(q, k, v, causal, softmax_scale, deterministic)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    o, _ = flash_attn_fwd(q, k, v, causal, scale, deterministic)
    return o
