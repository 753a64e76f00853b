"""What the Gluon kernels (forward_hopper.py, backward_hopper.py) share: TMA descriptors over the
callers' tensors, their shared-memory layouts, and the view of a 4-D box as a 2-D tile."""
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
