"""What the Gluon kernels (forward_hopper.py, backward_hopper.py) share: TMA descriptors over the
callers' tensors, their shared-memory layouts, the view of a 4-D box as a 2-D tile, the
buffers their pointer stores need, and the heavy-first launch order of their causal grids."""
from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def as_box(buffer, desc):
    """A 2-D shared-memory tile seen as the box of a 4-D descriptor, (1, 1, rows, d): the same bytes
    (the swizzle follows the two inner dimensions)."""
    return buffer._reinterpret(buffer.dtype, desc.block_type.shape, desc.layout)


@gluon.jit
def grouped_order(index, num_blocks, group, num_pairs):
    """Work item `index` of num_blocks blocks × num_pairs (batch, head) pairs: (block, pair). The
    pairs go in groups of `group`, and within a group the block is the slow index: group = 1 is the
    order of a (blocks, heads, batch) grid; a larger one runs block 0 (under causal, the kernel's
    heaviest, whichever way it numbers them) of `group` heads before block 1, so a launch does not
    end on heavy work, and those heads' operands share L2 (l2_group)."""
    g = index // (num_blocks * group)
    size = gl.minimum(group, num_pairs - g * group)  # the last group may be smaller
    r = index - g * num_blocks * group
    return r // size, g * group + r % size


def l2_group(num_pairs: int, budget_bytes: int, pair_bytes: int) -> int:
    """How many (batch, head) pairs grouped_order groups: as many as keep pair_bytes each within
    budget_bytes of L2, at least 1, at most all."""
    return max(1, min(num_pairs, budget_bytes // pair_bytes))


def gl_dtype(torch_dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[torch_dtype]


@functools.lru_cache(maxsize=None)
def smem_layout(box: tuple[int, ...], elem) -> gl.NVMMASharedLayout:
    # cached: working the layout out again cost ~10 µs of host time per descriptor
    return gl.NVMMASharedLayout.get_default_for(list(box), elem)


def tma_desc(t: torch.Tensor, block_rows: int, elem) -> TensorDescriptor:
    """A 2-D descriptor over contiguous t viewed as (rows, last dim), box (block_rows, last dim)."""
    box = (block_rows, t.shape[-1])
    return TensorDescriptor.from_tensor(t.view(-1, t.shape[-1]), list(box), smem_layout(box, elem))


def box_desc(t: torch.Tensor, block_rows: int, elem) -> TensorDescriptor:
    """A 4-D descriptor over (B, H, N, d) t with its own strides (unit stride along d, the others
    16-byte multiples: launch.tma_ok), box (1, 1, block_rows, d)."""
    box = (1, 1, block_rows, t.shape[-1])
    return TensorDescriptor.from_tensor(t, list(box), smem_layout(box, elem))


def operand_descs(operands: list[tuple[torch.Tensor, int]], elem, strided: bool) -> list[TensorDescriptor]:
    """Descriptors over (B, H, N, d) operands, each with its box rows. strided: 4-D over each
    tensor's own strides, a contiguous copy only where TMA can't read them (launch.tma_ok); else
    2-D over contiguous copies, which need each head's rows back to back (the model's q, k, v, dO
    are strided views: the copies cost about what the single-pass backward saves at N ≈ 8K,
    docs/perf-notes.md v7)."""
    from kernels.flash_attn.launch import tma_ok  # launch imports these modules lazily: no cycle at import

    if strided:
        return [box_desc(t if tma_ok(t) else t.contiguous(), rows, elem) for t, rows in operands]
    return [tma_desc(t.contiguous(), rows, elem) for t, rows in operands]


def store_target(t: torch.Tensor) -> torch.Tensor:
    """Where a kernel that stores rows by pointer (unit stride along d) writes t: t itself, or a
    contiguous buffer to copy into t afterwards when t is strided along d."""
    return t if t.stride(-1) == 1 else torch.empty(t.shape, device=t.device, dtype=t.dtype)
