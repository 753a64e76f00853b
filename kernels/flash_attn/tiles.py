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


# ----------------------------------------------------------------------------------------------
# Masks: which tiles a program visits, and which elements of a visited tile it keeps.
#
# Query i sees key j iff j < seqlen_k and
#   CAUSAL:  j <= i + offset                                   (offset = seqlen_k − seqlen_q)
#   WINDOW:  i + offset − left <= j <= i + offset + right       (left/right: launch.py passes a
#            bound past every position for an unlimited side and folds causal into right = 0)
#   DOCS:    doc[i] == doc[j]
# Positional masks are bands, so a program's visible tiles form a range with a fully visible
# middle: tile_range gives the bounds. Documents narrow that range further (launch.py derives each
# block's first and last overlapping tile from per-tile min/max of the ids); inside it, the run of
# tiles that are all the block's own document gets no document mask (doc_range).
# ----------------------------------------------------------------------------------------------


@triton.jit
def tile_range(start, BLOCK: tl.constexpr, BLOCK_OTHER: tl.constexpr, n_other, shift, before, after):
    """Bounds on the other axis for the rows [start, start + BLOCK), row r seeing positions
    [r + shift − before, r + shift + after] of an axis n_other long: [lo, hi) holds every visible
    position, [full_lo, full_hi) only positions every row sees (tiles there need no positional
    mask), lo <= full_lo <= full_hi <= hi, all but hi multiples of BLOCK_OTHER. From a query block
    (keys): shift = offset, before = left, after = right; from a key block (queries): shift =
    −offset, before = right, after = left."""
    lo = tl.maximum(start + shift - before, 0) // BLOCK_OTHER * BLOCK_OTHER
    hi = tl.minimum(n_other, start + BLOCK + shift + after)
    hi = tl.maximum(hi, lo)
    # the last row's first position, rounded up; the first row's last position + 1, rounded down
    full_lo = tl.cdiv(tl.maximum(start + BLOCK - 1 + shift - before, 0), BLOCK_OTHER) * BLOCK_OTHER
    full_hi = tl.minimum(n_other, start + shift + after + 1) // BLOCK_OTHER * BLOCK_OTHER
    no_middle = full_hi <= full_lo
    full_lo = tl.where(no_middle, hi, tl.maximum(full_lo, lo))
    full_hi = tl.where(no_middle, hi, full_hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def clip_range(lo, full_lo, full_hi, hi, other_lo, other_hi):
    """Intersect tile_range's bounds with [other_lo, other_hi) (a block's document range),
    keeping lo <= full_lo <= full_hi <= hi (an empty range leaves every loop empty)."""
    lo = tl.maximum(lo, other_lo)
    hi = tl.minimum(hi, other_hi)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def key_bounds(start, BLOCK: tl.constexpr, BLOCK_OTHER: tl.constexpr, seqlen_k, offset, win_left, win_right,
               DOC_RANGE, block, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr):
    """The key blocks a query block [start, start + BLOCK) visits (the forward's and the dQ
    pass's): lo, full_lo, pure_lo, pure_hi, full_hi, hi as doc_range returns them; without
    documents [pure_lo, pure_hi) is the whole fully visible middle [full_lo, full_hi)."""
    if WINDOW:
        lo, full_lo, full_hi, hi = tile_range(start, BLOCK, BLOCK_OTHER, seqlen_k, offset, win_left, win_right)
    else:
        full_hi, hi = causal_bounds(start, BLOCK, BLOCK_OTHER, seqlen_k, offset, CAUSAL)
        lo = 0
        full_lo = 0
    pure_lo = full_lo
    pure_hi = full_hi
    if DOCS:  # only the key blocks of this block's documents
        lo, full_lo, pure_lo, pure_hi, full_hi, hi = doc_range(DOC_RANGE, block, lo, full_lo, full_hi, hi)
    return lo, full_lo, pure_lo, pure_hi, full_hi, hi


@triton.jit
def positions_visible(q_idx, k_idx, seqlen_k, offset, win_left, win_right, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """The positional mask for broadcast-shaped query and key indices (True: visible)."""
    keep = k_idx < seqlen_k
    if CAUSAL:
        keep = keep & (k_idx <= q_idx + offset)
    if WINDOW:
        keep = keep & (k_idx >= q_idx + offset - win_left) & (k_idx <= q_idx + offset + win_right)
    return keep


@triton.jit
def doc_ids(doc_base, idx, seqlen):
    """Document ids at positions idx (0 past seqlen: such positions are masked by position or
    carry P = 0 already, and their rows and columns are never stored)."""
    return tl.load(doc_base + idx, mask=idx < seqlen, other=0)


@triton.jit
def doc_range(DOC_RANGE, block, lo, full_lo, full_hi, hi):
    """A block's document range (masks.document_ranges: int32 [lo, hi, pure_lo, pure_hi] per
    block) applied to tile_range's bounds: [lo, hi) clipped to the tiles its documents reach, and
    the fully visible middle cut around the run of tiles that are all its own document. Returns
    lo, full_lo, pure_lo, pure_hi, full_hi, hi in order: the tiles of [full_lo, pure_lo) and
    [pure_hi, full_hi) need the document mask only, those of [pure_lo, pure_hi) no mask at all."""
    rng = DOC_RANGE + block * 4
    lo, full_lo, full_hi, hi = clip_range(lo, full_lo, full_hi, hi, tl.load(rng), tl.load(rng + 1))
    pure_lo = tl.minimum(tl.maximum(tl.load(rng + 2), full_lo), full_hi)
    pure_hi = tl.minimum(tl.maximum(tl.load(rng + 3), pure_lo), full_hi)
    return lo, full_lo, pure_lo, pure_hi, full_hi, hi
