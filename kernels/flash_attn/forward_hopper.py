"""The Hopper fast path for the forward: FlashAttention-3's ping-pong schedule in Gluon.

The same online softmax as forward.py (read that file first: it is the algorithm, this one is its
schedule on an sm_90 GPU). A tile is BLOCK_M = CONSUMERS × 64 query rows of one (batch, head)
(CONSUMERS = 2 or 3 in the launch table); a 1-D grid runs one program per tile, or (PERSISTENT)
one per SM, each taking a tile per round of a snake over the tiles (_nth_tile) with the ring
position and the GEMM turns running on across its tiles, so the next tile's loads overlap the
last one's epilogue. Partitions
(gl.warp_specialize), per tile:

    producer (1 warp):  Q's 64-row slices by TMA (each once its warpgroup has done with the
                        previous tile's), then K_j and V_j into a STAGES-deep ring
    consumer w (one warpgroup each, query rows [64·w, 64·w + 64) of the block):
        S_0 = Q Kᵀ_0;  softmax_0
        for j = 1 .. n−1:
            ─ wait for my turn ─  S_j = Q Kᵀ_j  and  O += P_{j−1} V_{j−1}   (async wgmma)  ─ next one's turn ─
            softmax_j on S_j (m, l, P_j; α = e^{m_{j−1} − m_j})   while PV_{j−1} still runs
            O ← α · O (once PV_{j−1} has landed)
        O += P_{n−1} V_{n−1};  O / l, LSE = m + log2 l

Two overlaps hide the exponentials. An H100 / H200 does 989 TFLOP/s of bf16 matmul but ~3.9 T
exp2 per second (FlashAttention-3's figures), so at d=64 a tile's exponentials take about as long
as its two GEMMs (4·d FLOPs per score): inside a warpgroup, softmax_j runs while PV_{j−1} is on
the tensor cores; across warpgroups, the turn barriers make them take turns at issuing GEMMs, so
one's softmax runs while another's GEMMs do. v5 of docs/perf-notes.md measured a draft without
the second overlap (one 8-warp partition): slower than the `tl` kernel.

Edges: Q / K / V through 2-D descriptors over the flattened (B·H·N, d) tensors, or (STRIDED) 4-D
ones over the callers' (B, H, N, d) strides. Key rows past Nk (the next head's, or TMA's zero
fill) are masked to −inf; query rows past Nq are computed and not stored. Causal is bottom-right
aligned as in forward.py; rows that see no key (Nq > Nk) give O = 0 and LSE = +inf.
A sliding window (WINDOW, masks.py's bounds) visits only the key blocks some row of the tile sees
(tiles.tile_range, as forward.py) and masks the blocks at its two edges.
Limits: d ∈ {64, 128}, bf16 / fp16, no document ids (launch.hopper_unsupported).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
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

from kernels.flash_attn.gluon_tma import as_box, gl_dtype, grouped_order, l2_group, operand_descs, store_target
from kernels.flash_attn.masks import resolve
from kernels.flash_attn.tiles import LOG2E, tile_range

if TYPE_CHECKING:
    from kernels.flash_attn.launch import HopperForwardConfig

ROWS_PER_WARPGROUP = 64  # query rows per consumer warpgroup (the wgmma's M)
L2_GROUP_BYTES = 32 << 20  # K / V bytes a persistent causal launch keeps in flight (the H200's L2: 50 MB)
HALF = gl.constexpr(ROWS_PER_WARPGROUP)


@gluon.jit
def _load_rows(desc, ring_slot, bar, b, h, row0, start, STRIDED: gl.constexpr):
    """TMA load of rows [start, start + box rows) of head (b, h) into ring_slot, completion on bar.
    row0: the head's first row in the flattened 2-D view."""
    if STRIDED:
        tma.async_copy_global_to_shared(desc, [b, h, start, 0], bar, as_box(ring_slot, desc))
    else:
        tma.async_copy_global_to_shared(desc, [row0 + start, 0], bar, ring_slot)


@gluon.jit
def _tile(tile, num_m, group, num_pairs, heads_q, heads_kv, seqlen_q, seqlen_k, win_left, win_right,
          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """Tile number `tile`: its batch, head, kv head, first query row, first key and number of key
    blocks to visit, and the head's first rows in the flattened Q (and LSE) and K / V, in
    gluon_tma.grouped_order's order over (query block, (batch, head) pair): group = 1 is a 3-D
    grid's; a larger one (persistent causal launches) brings the heavy query blocks of `group`
    heads, whose K / V fit in L2 together, to the front."""
    pid_m, bh = grouped_order(tile, num_m, group, num_pairs)
    if CAUSAL:  # the last query blocks see the most keys: started first, they shorten the tail
        pid_m = num_m - 1 - pid_m
    h = bh % heads_q
    b = bh // heads_q
    kvh = h // (heads_q // heads_kv)
    start_m = pid_m * BLOCK_M
    k_lo = 0
    hi = seqlen_k
    if CAUSAL:
        hi = gl.minimum(gl.maximum(start_m + BLOCK_M + seqlen_k - seqlen_q, 0), seqlen_k)
    if WINDOW:  # the keys some row of the tile sees (forward.py's bounds); k_lo a block multiple
        k_lo, _, _, hi = tile_range(start_m, BLOCK_M, BLOCK_N, seqlen_k, seqlen_k - seqlen_q, win_left, win_right)
    n_blocks = gl.cdiv(hi - k_lo, BLOCK_N)
    return b, h, kvh, start_m, k_lo, n_blocks, (b * heads_q + h) * seqlen_q, (b * heads_kv + kvh) * seqlen_k


@gluon.jit
def _nth_tile(rnd):
    """The tile a program takes in its rnd-th turn. The programs sweep the tiles in rounds of
    num_programs, alternating direction (a snake), so that under causal each program's heavy and
    light tiles even out; with one program per tile it is program_id."""
    programs = gl.num_programs(0)
    pid = gl.program_id(0)
    return rnd * programs + gl.where(rnd % 2 == 0, pid, programs - 1 - pid)


@gluon.jit
def _rounds(num_tiles):
    """How many tiles this program takes: all its rounds but the last, which only the programs
    whose tile exists take part in."""
    rounds = gl.cdiv(num_tiles, gl.num_programs(0))
    return gl.where(_nth_tile(rounds - 1) < num_tiles, rounds, rounds - 1)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty,
              num_m, num_tiles, group, num_pairs, heads_q, heads_kv, seqlen_q, seqlen_k, win_left, win_right,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
              STRIDED: gl.constexpr, CONSUMERS: gl.constexpr):
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    it = 0  # K / V tiles loaded so far by this program: the ring's position runs on across tiles
    i = 0  # tiles of this program so far
    for rnd in range(_rounds(num_tiles)):
        b, h, kvh, start_m, k_lo, n_blocks, q_row0, kv_row0 = _tile(
            _nth_tile(rnd), num_m, group, num_pairs, heads_q, heads_kv, seqlen_q, seqlen_k, win_left, win_right,
            BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        for w in gl.static_range(CONSUMERS):
            # Q's slice w is free once its warpgroup's last S of the previous tile has landed
            mbarrier.wait(q_empty.index(w), (i & 1) ^ 1)
            mbarrier.expect(q_bar.index(w), q_desc.block_type.nbytes)
            _load_rows(q_desc, q_smem.index(w), q_bar.index(w), b, h, q_row0, start_m + w * HALF, STRIDED)
        for j in range(n_blocks):
            s = it % STAGES
            # the (it // STAGES)-th fill of slot s waits for every consumer's release of the previous one
            # (parity ((it // STAGES) & 1) ^ 1, which a fresh barrier passes at once)
            phase = ((it // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(s), phase)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _load_rows(k_desc, k_ring.index(s), k_ready.index(s), b, kvh, kv_row0, k_lo + j * BLOCK_N, STRIDED)
            mbarrier.wait(v_empty.index(s), phase)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            _load_rows(v_desc, v_ring.index(s), v_ready.index(s), b, kvh, kv_row0, k_lo + j * BLOCK_N, STRIDED)
            it += 1
        i += 1


@gluon.jit
def _wait_turn(turn, t, W: gl.constexpr):
    """Block until warpgroup W may issue its t-th GEMM block. The turn goes round the warpgroups in
    order: warpgroup 0 goes first (its fresh barrier passes parity 1), each of the others waits for
    its predecessor's arrive of the same round."""
    if W == 0:
        parity = (t & 1) ^ 1
    else:
        parity = t & 1
    mbarrier.wait(turn.index(W), parity)


@gluon.jit
def _scores(q, k_ring, k_ready, turn, it, t, s_layout: gl.constexpr, W: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Wait for the K tile at ring position `it` and for this warpgroup's turn `t`, issue
    S = Q Kᵀ (async, left in flight)."""
    mbarrier.wait(k_ready.index(it % STAGES), (it // STAGES) & 1)
    _wait_turn(turn, t, W)
    zero_s = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q, k_ring.index(it % STAGES).permute((1, 0)), zero_s, use_acc=False, is_async=True)


@gluon.jit
def _softmax(s, m_i, l_i, col0, rows, row_lo, offs_n, seqlen_k, offset, win_left, win_right, qk_scale,
             BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """forward.py's update on the key tile starting at col0: P (float32), the new m, l, and α for
    the accumulator."""
    cols = col0 + offs_n
    if CAUSAL:
        if col0 + BLOCK_N - 1 > row_lo + offset:  # a diagonal tile (the key tail beyond Nk included)
            s = gl.where(cols[None, :] <= rows[:, None] + offset, s, float("-inf"))
    elif WINDOW:
        # a tile some of this warpgroup's rows see only in part: either window edge, or the key tail
        if ((col0 < row_lo + HALF - 1 + offset - win_left) | (col0 + BLOCK_N - 1 > row_lo + offset + win_right)
                | (col0 + BLOCK_N > seqlen_k)):
            # tiles.positions_visible's test, one bound at a time (each mask dies at once: fewer registers)
            s = gl.where(cols[None, :] <= rows[:, None] + (offset + win_right), s, float("-inf"))
            s = gl.where(cols[None, :] >= rows[:, None] + (offset - win_left), s, float("-inf"))
            s = gl.where(cols[None, :] < seqlen_k, s, float("-inf"))
    else:
        if col0 + BLOCK_N > seqlen_k:  # the ragged last tile: the next head's keys, or zeros
            s = gl.where(cols[None, :] < seqlen_k, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    m_sub = m_new
    if CAUSAL or WINDOW:  # a row that has seen no key yet keeps m = −inf: subtract 0, never e^{−inf − (−inf)}
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_sub[:, None])
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _consume_tile(q, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, turn, q_free, OUT, LSE, stride_on, lse_row0,
                  start_m, k_lo, n_blocks, it0, t0, seqlen_q, seqlen_k, win_left, win_right, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  WINDOW: gl.constexpr, W: gl.constexpr, CONSUMERS: gl.constexpr):
    """One tile's rows [start_m + 64·W, +64): its key blocks (from key k_lo) at ring positions it0, it0 + 1, ...
    and GEMM turns t0, t0 + 1, ...; q_free is arrived once every S of the tile has landed."""
    # S (64 × BLOCK_N) and O (64 × d) accumulators over one warpgroup; P as the register A operand
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    ELEM: gl.constexpr = q.dtype
    offset = seqlen_k - seqlen_q
    row_lo = start_m + W * HALF
    rows = row_lo + gl.arange(0, HALF, layout=row_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([HALF], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([HALF], gl.float32, row_layout)
    acc = gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout)

    if n_blocks > 0:
        s = _scores(q, k_ring, k_ready, turn, it0, t0, s_layout, W, BLOCK_N, STAGES)
        mbarrier.arrive(turn.index((W + 1) % CONSUMERS))
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_empty.index(it0 % STAGES))
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, k_lo, rows, row_lo, offs_n, seqlen_k, offset, win_left, win_right,
                                      qk_scale, BLOCK_N, CAUSAL, WINDOW)
        # P carried to the next GEMM block as the 16-bit register operand: half the registers of float32
        p = gl.convert_layout(p.to(ELEM), p_layout)
        for j in range(1, n_blocks):
            it = it0 + j
            prev = (it - 1) % STAGES
            s = _scores(q, k_ring, k_ready, turn, it, t0 + j, s_layout, W, BLOCK_N, STAGES)
            mbarrier.wait(v_ready.index(prev), ((it - 1) // STAGES) & 1)
            acc = warpgroup_mma(p, v_ring.index(prev), acc, is_async=True)
            mbarrier.arrive(turn.index((W + 1) % CONSUMERS))
            s = warpgroup_mma_wait(1, deps=(s,))  # S_j has landed; PV_{j−1} may still run
            mbarrier.arrive(k_empty.index(it % STAGES))
            p32, m_i, l_i, alpha = _softmax(s, m_i, l_i, k_lo + j * BLOCK_N, rows, row_lo, offs_n, seqlen_k, offset,
                                            win_left, win_right, qk_scale, BLOCK_N, CAUSAL, WINDOW)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(v_empty.index(prev))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p = gl.convert_layout(p32.to(ELEM), p_layout)
        mbarrier.arrive(q_free)  # every S of the tile has landed: the producer may load the next Q
        it_last = it0 + n_blocks - 1
        last = it_last % STAGES
        mbarrier.wait(v_ready.index(last), (it_last // STAGES) & 1)
        _wait_turn(turn, t0 + n_blocks, W)  # the last GEMM takes its turn too
        acc = warpgroup_mma(p, v_ring.index(last), acc, is_async=True)
        mbarrier.arrive(turn.index((W + 1) % CONSUMERS))
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_empty.index(last))
    else:
        mbarrier.arrive(q_free)

    if CAUSAL or WINDOW:  # rows that see no key: O = 0/1, LSE = +inf, as forward.py
        if CAUSAL:
            empty = rows + offset < 0
        else:  # a window can leave rows anywhere with no key: those kept m = −inf
            empty = m_i == float("-inf")
        l_i = gl.where(empty, 1.0, l_i)
        m_i = gl.where(empty, float("inf"), m_i)
    gl.store(LSE + lse_row0 + rows, m_i + gl.log2(l_i), mask=rows < seqlen_q)
    out_rows = gl.convert_layout(rows, gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    ok = (out_rows < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    gl.store(OUT + out_rows[:, None] * stride_on + offs_d[None, :], out.to(ELEM), mask=ok)


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, OUT, LSE,
              stride_ob, stride_oh, stride_on, num_m, num_tiles, group, num_pairs, heads_q, heads_kv, seqlen_q,
              seqlen_k, win_left, win_right, qk_scale,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              WINDOW: gl.constexpr, W: gl.constexpr, CONSUMERS: gl.constexpr):
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    it0 = 0  # ring position of the tile's first key block
    t0 = 0  # GEMM turns taken so far
    i = 0
    for rnd in range(_rounds(num_tiles)):
        b, h, kvh, start_m, k_lo, n_blocks, q_row0, kv_row0 = _tile(
            _nth_tile(rnd), num_m, group, num_pairs, heads_q, heads_kv, seqlen_q, seqlen_k, win_left, win_right,
            BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        mbarrier.wait(q_bar.index(W), i & 1)
        _consume_tile(q_smem.index(W), k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, turn, q_empty.index(W),
                      OUT + b * stride_ob + h * stride_oh, LSE, stride_on, q_row0, start_m, k_lo, n_blocks, it0, t0,
                      seqlen_q, seqlen_k, win_left, win_right, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WINDOW,
                      W, CONSUMERS)
        it0 += n_blocks
        t0 += gl.where(n_blocks > 0, n_blocks + 1, 0)
        i += 1


# lengths and head counts are not specialized (no recompiles for N == 1 or N % 16 == 0)
@gluon.jit(do_not_specialize=["heads_q", "heads_kv", "seqlen_q", "seqlen_k", "num_m", "num_tiles", "group",
                               "num_pairs", "win_left", "win_right"])
def fwd_hopper_kernel(q_desc, k_desc, v_desc, OUT, LSE, stride_ob, stride_oh, stride_on,
                      heads_q, heads_kv, seqlen_q, seqlen_k, num_m, num_tiles, group, num_pairs, win_left, win_right,
                      qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr, WINDOW: gl.constexpr, STRIDED: gl.constexpr, CONSUMERS: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr):
    """A 1-D grid over tiles (query block, head, batch; _tile's order): one program per tile, or
    (persistent) fewer programs that each take a tile per round (_nth_tile)."""
    ELEM: gl.constexpr = k_desc.dtype
    q_smem = gl.allocate_shared_memory(ELEM, [CONSUMERS, HALF, HEAD_DIM], gl.NVMMASharedLayout.get_default_for([HALF, HEAD_DIM], ELEM))
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], ELEM)
    k_ring = gl.allocate_shared_memory(ELEM, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_ring = gl.allocate_shared_memory(ELEM, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer releases a slot
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    fence_async_shared()

    # (the consumers' argument lists written out: a constexpr inside a tuple built here would reach
    # them as a tensor)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, OUT, LSE,
                         stride_ob, stride_oh, stride_on, num_m, num_tiles, group, num_pairs, heads_q, heads_kv,
                         seqlen_q, seqlen_k, win_left, win_right, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WINDOW,
                         0, 2)),
            (_consumer, (q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, OUT, LSE,
                         stride_ob, stride_oh, stride_on, num_m, num_tiles, group, num_pairs, heads_q, heads_kv,
                         seqlen_q, seqlen_k, win_left, win_right, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WINDOW,
                         1, 2)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty,
                         v_empty, num_m, num_tiles, group, num_pairs, heads_q, heads_kv, seqlen_q, seqlen_k, win_left, win_right,
                         BLOCK_N, STAGES, CAUSAL, WINDOW,
                         STRIDED, 2)),
        ], [4, 1], [CONSUMER_REGS, 24])  # the second consumer warpgroup, the 1-warp producer
    else:  # three warpgroups of 64 rows (FlashAttention-3's 192-row tile at d=64)
        gl.warp_specialize([
            (_consumer, (q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, OUT, LSE,
                         stride_ob, stride_oh, stride_on, num_m, num_tiles, group, num_pairs, heads_q, heads_kv,
                         seqlen_q, seqlen_k, win_left, win_right, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WINDOW,
                         0, 3)),
            (_consumer, (q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, OUT, LSE,
                         stride_ob, stride_oh, stride_on, num_m, num_tiles, group, num_pairs, heads_q, heads_kv,
                         seqlen_q, seqlen_k, win_left, win_right, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WINDOW,
                         1, 3)),
            (_consumer, (q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, OUT, LSE,
                         stride_ob, stride_oh, stride_on, num_m, num_tiles, group, num_pairs, heads_q, heads_kv,
                         seqlen_q, seqlen_k, win_left, win_right, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WINDOW,
                         2, 3)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty,
                         v_empty, num_m, num_tiles, group, num_pairs, heads_q, heads_kv, seqlen_q, seqlen_k, win_left, win_right,
                         BLOCK_N, STAGES, CAUSAL, WINDOW,
                         STRIDED, 3)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def forward_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                   config: HopperForwardConfig, window_size: tuple[int, int] = (-1, -1)) -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's dtype and layout) and LSE in base 2 (float32 (B, Hq, Nq)), as launch.forward.
    q (B, Hq, Nq, d), k, v (B, Hkv, Nk, d), bf16 / fp16, d 64 or 128; causal and / or a sliding
    window (the public convention, masks.py)."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    mask = resolve(causal, window_size, None, seqlen_q, seqlen_k)
    elem = gl_dtype(q.dtype)
    o = torch.empty_like(q)
    o_out = store_target(o)
    lse2 = torch.empty((batch, heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    bn = config.BLOCK_N
    descs = operand_descs([(q, ROWS_PER_WARPGROUP), (k, bn), (v, bn)], elem, config.STRIDED)
    num_m = triton.cdiv(seqlen_q, config.CONSUMERS * ROWS_PER_WARPGROUP)
    num_pairs = heads_q * batch
    num_tiles = num_m * num_pairs
    programs = min(num_tiles, _sm_count(q.device)) if config.PERSISTENT else num_tiles
    # persistent and causal: heavy tiles first over as many heads as keep their K / V in L2 (a 3-D
    # grid's order, group 1, would hand each program tiles of one weight: some get only heavy ones)
    group = 1
    if config.PERSISTENT and mask.causal:
        group = l2_group(num_pairs, L2_GROUP_BYTES, 2 * seqlen_k * head_dim * q.element_size())
    fwd_hopper_kernel[(programs,)](
        *descs, o_out, lse2, *o_out.stride()[:3], heads_q, heads_kv, seqlen_q, seqlen_k, num_m, num_tiles, group,
        num_pairs, mask.left, mask.right, scale * LOG2E.value,
        HEAD_DIM=head_dim, BLOCK_N=bn, STAGES=config.STAGES, CAUSAL=mask.causal, WINDOW=mask.window, STRIDED=config.STRIDED,
        CONSUMERS=config.CONSUMERS, CONSUMER_REGS=config.CONSUMER_REGS, num_warps=4,
    )
    if o_out is not o:
        o.copy_(o_out)
    return o, lse2
