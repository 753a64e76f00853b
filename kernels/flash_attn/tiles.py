"""Tile helpers shared by the forward and backward kernels: constants, operand rounding, the
causal key range, and how a streamed tile is loaded.

Loads: the tiles an inner loop streams (K, V past a query block; Q, dO past a key block) come
either through masked pointer loads or, where the config table measured it faster (the dQ pass;
the dK/dV pass at d=128) and the layout allows, through TMA tensor descriptors (Hopper's copy
engine, which zero-fills past the sequence and the head dim just as the masks do).
"""
import triton
import triton.language as tl

# Exponentials are exp2 with log2(e) folded into the scale: e^x = 2^{x·LOG2E}; back with log(x) = log2(x)·LN2.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def mma_operand(x, ELEM: tl.constexpr, UPCAST: tl.constexpr):
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
def dot_acc(a, b, acc, DOT_PRECISION: tl.constexpr):
    """acc + a @ b, for the backward's accumulators (dK, dV over query blocks, dQ over key blocks).

    With true float32 products (DOT_PRECISION "ieee": FMA loops, no tensor cores) a dot sums its
    inner dimension sequentially, so handing it `acc` chains every block into one sequential sum
    whose float32 error grows with the sequence (3x PyTorch's on the H200 for dV summed over 510
    rows). There each block's product is summed from zero and then added: a two-level sum. The add
    is an fma(x, 1, acc) because Triton folds `dot(a, b) + acc` back into dot(a, b, acc)."""
    if DOT_PRECISION == "ieee":
        return tl.fma(tl.dot(a, b, input_precision=DOT_PRECISION), 1.0, acc)
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def causal_bounds(start, BLOCK: tl.constexpr, BLOCK_OTHER: tl.constexpr, seqlen_k, offset, CAUSAL: tl.constexpr):
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
def row_source(base, seqlen, stride_n, stride_d, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
               HEAD_DIM: tl.constexpr, TMA: tl.constexpr):
    """What an inner loop streams (BLOCK, BLOCK_D) row tiles of one head from.

    With TMA, a tensor descriptor over the head's (seqlen, HEAD_DIM) rows: Hopper's copy engine
    then moves each tile to shared memory, with no per-element address or mask arithmetic in the
    registers, and fills rows past seqlen and columns past HEAD_DIM with zeros. Without, the head's
    base pointer, for masked loads (load_rows)."""
    if TMA:
        return tl.make_tensor_descriptor(base, shape=[seqlen, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK, BLOCK_D])
    else:
        return base


@triton.jit
def load_rows(src, start, offs_r, offs_d, seqlen, stride_n, stride_d, HEAD_DIM: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + len(offs_r)) of a row_source, zero past seqlen and past HEAD_DIM."""
    if TMA:
        return src.load([start, 0])
    else:
        rows = start + offs_r
        ok = (rows[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM)
        return tl.load(src + rows[:, None] * stride_n + offs_d[None, :] * stride_d, mask=ok, other=0.0)
