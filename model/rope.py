"""Rotary position embeddings (RoFormer, Su et al. 2021): position enters attention as a rotation of q and k.

Each head's D features form D/2 pairs (i, i + D/2) (the "rotate half" pairing of GPT-NeoX and
Llama); pair i of a token at position p is rotated by the angle p·θ_i, θ_i = base^(−2i/D). A
rotation keeps norms, and the dot product of q rotated by p·θ with k rotated by p'·θ depends on
p − p' alone: attention sees relative positions, and no table grows with the sequence (a learned
table of 128K positions would be 134M parameters of GPT-2 medium).

Positions are global (what `GPT.forward(positions=...)` passes), so a shard of a long sequence
rotates its tokens exactly as the whole sequence would. The angles p·θ_i are formed in float64:
in float32, p ≈ 1.3·10^5 is only known to ±0.008, which would turn into a rotation error of that
size on every high-frequency pair.
"""

from __future__ import annotations

import torch
from torch import Tensor

Rope = tuple[Tensor, Tensor]  # (cos, sin), each (1 or B, 1, N, D/2): broadcast over heads


def rope_angles(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype = torch.float32) -> Rope:
    """(cos, sin) of p·θ_i for positions (N,) or (B, N), shaped (1, N, D/2) or (B, 1, N, D/2)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings pair up features: head_dim={head_dim} must be even")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., N, D/2)
    angles = angles.unsqueeze(-3)  # a heads axis of 1: (1, N, D/2) or (B, 1, N, D/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """x (B, H, N, D) rotated pair by pair; computed in at least float32, returned in x's dtype."""
    cos, sin = rope
    compute = torch.promote_types(x.dtype, torch.float32)  # a bf16 rotation would round each product
    x1, x2 = x.to(compute).chunk(2, dim=-1)  # the two halves: pair i is (x1[i], x2[i])
    cos, sin = cos.to(compute), sin.to(compute)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)
