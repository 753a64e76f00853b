"""What the Gluon kernels (forward_hopper.py, backward_hopper.py) share: TMA descriptors over the
callers' tensors, their shared-memory layouts, the view of a 4-D box as a 2-D tile, and the
buffers their pointer stores need."""
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
