"""Ring attention over our kernel: exact attention for a sequence split over the ranks of a group.

Each of the cp ranks holds its queries and one block of keys/values. The K/V blocks travel around
the ring (rank r sends to r+1 and receives from r-1, point to point, while it computes), so after
cp steps every query has met every key. Step s runs the kernel's forward on the local queries and
the block in hand, which returns the partial output O_s and its log-sum-exp
L_s = log Σ_{j in block s} e^{scale·q·k_j}. Partials over disjoint key blocks merge exactly, as
the online softmax merges two key tiles (α = e^{m_old − m_new} there, e^{L_old − L} here):

    L = logaddexp(L_old, L_s),    O = e^{L_old − L}·O_old + e^{L_s − L}·O_s        (in fp32)

Backward: given the merged O and L, P = e^{S − L} and delta = rowsum(dO ∘ O) are those of the full
attention, so flash_attn_backward on (local queries, block s) returns that block's exact dK_s and
dV_s and its share of dQ. dQ adds up locally (fp32); each block's dK/dV accumulator travels the
ring with the block and is back home after cp hops.

Zigzag layout (causal): the sequence is cut into 2·cp chunks and rank r holds chunks r and
2cp−1−r, so every rank has as many visible (query, key) pairs as any other. At step s rank r holds
the K/V of rank src = (r − s) mod cp:
  s = 0      all local queries × all local keys, causal (the two chunks concatenated keep the order)
  src < r    all local queries × key chunk src only (chunk 2cp−1−src comes after both query chunks)
  src > r    query chunk 2cp−1−r only × all keys (query chunk r comes before both key chunks)
so each step after the first is half a local block on every rank: no rank waits for another.
Without the causal mask any layout works; each step is all queries × all keys.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from kernels import flash_attn_backward, flash_attn_forward


def zigzag_indices(seq_len: int, cp: int, rank: int) -> Tensor:
    """Positions (in 0..seq_len-1) of the tokens rank `rank` of `cp` holds: chunks rank and 2cp−1−rank."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len={seq_len} must be divisible by 2 × cp = {2 * cp} for the zigzag split")
    chunk = seq_len // (2 * cp)
    late = 2 * cp - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(late * chunk, (late + 1) * chunk)])


class _Ring:
    """The group's ranks in a ring: tensors go to the next rank, arrive from the previous one."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)  # P2POp wants global ranks
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def pass_on(self, *tensors: Tensor) -> tuple[list[Tensor], list[dist.Work]]:
        """Start sending `tensors` to the next rank and receiving the previous rank's into new buffers;
        returns them with the requests to wait for. The caller computes meanwhile."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        return received, dist.batch_isend_irecv(ops)


def _wait(requests: list[dist.Work]) -> None:
    for request in requests:
        request.wait()


def _step_block(step: int, ring: _Ring, causal: bool, n: int) -> tuple[slice, slice, bool]:
    """(local query rows, rows of the K/V block in hand, causal) for ring step `step` (module docstring)."""
    everything = slice(None)
    if not causal or step == 0:
        return everything, everything, causal
    src = (ring.rank - step) % ring.size
    if src < ring.rank:
        return everything, slice(0, n // 2), False
    return slice(n // 2, None), everything, False


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None, ring: _Ring) -> tuple[Tensor, Tensor]:
    out = lse = None  # (B, H, N, D) and (B, H, N), fp32: the merged result so far
    n = q.shape[2]
    for step in range(ring.size):
        if step + 1 < ring.size:
            (next_k, next_v), requests = ring.pass_on(k, v)  # the next block travels while this one computes
        rows, cols, block_causal = _step_block(step, ring, causal, n)
        o_s, lse_s = flash_attn_forward(q[:, :, rows], k[:, :, cols], v[:, :, cols], block_causal, scale)
        if out is None:  # step 0: every row sees at least its own key, so lse is finite from here on
            out, lse = o_s.float(), lse_s
        else:
            lse_old = lse[:, :, rows]
            merged = torch.logaddexp(lse_old, lse_s)
            out[:, :, rows] = (lse_old - merged).exp()[..., None] * out[:, :, rows] + (lse_s - merged).exp()[..., None] * o_s.float()
            lse[:, :, rows] = merged
        if step + 1 < ring.size:
            _wait(requests)
            k, v = next_k, next_v
    return out.to(q.dtype), lse


def _backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float | None,
    deterministic: bool | None, ring: _Ring,
) -> tuple[Tensor, Tensor, Tensor]:
    n = q.shape[2]
    dq = torch.zeros_like(q, dtype=torch.float32)
    dk = dv = None  # fp32 accumulators of the block in hand; they travel with it
    for step in range(ring.size):
        sends: tuple[Tensor, ...] = (k, v) if step + 1 < ring.size else ()
        if step > 0:  # the previous block's dK/dV goes on with that block; this block's arrives
            sends += (dk, dv)
        received, requests = ring.pass_on(*sends) if sends else ([], [])
        rows, cols, block_causal = _step_block(step, ring, causal, n)
        dq_s, dk_s, dv_s = flash_attn_backward(
            dout[:, :, rows], q[:, :, rows], k[:, :, cols], v[:, :, cols], out[:, :, rows],
            lse[:, :, rows].contiguous(), block_causal, scale, deterministic,
        )
        dq[:, :, rows] += dq_s
        _wait(requests)
        if step + 1 < ring.size:
            k, v = received[:2]
        dk, dv = (received[-2:] if step > 0 else (torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)))
        dk[:, :, cols] += dk_s
        dv[:, :, cols] += dv_s
    (dk, dv), requests = ring.pass_on(dk, dv)  # the last hop: each accumulator back to its own rank
    _wait(requests)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, deterministic, group):
        ring = _Ring(group)
        k, v = k.contiguous(), v.contiguous()  # they are sent as they are: P2P needs dense memory
        out, lse = _forward(q, k, v, causal, scale, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.deterministic, ctx.ring = causal, scale, deterministic, ring
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale, ctx.deterministic, ctx.ring)
        return dq, dk, dv, None, None, None, None


@torch.compiler.disable  # P2P calls are not traced: under torch.compile the attention runs eagerly
def ring_flash_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, group: dist.ProcessGroup,
    softmax_scale: float | None = None, deterministic: bool | None = None,
) -> Tensor:
    """flash_attention over a sequence split across `group`: this rank's q, k, v (B, H, N_local, D)
    hold its tokens (in zigzag order when causal: zigzag_indices); returns this rank's output rows.
    Differentiable; out and the gradients of q, k, v match flash_attention on the whole sequence.
    `deterministic` picks each step's backward as flash_attention's does; the ring adds the steps'
    results in a fixed order, so it is bitwise repeatable when they are."""
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"ring attention is self-attention: q has {q.shape[2]} local tokens, k and v {k.shape[2]}")
    if causal and q.shape[2] % 2:
        raise ValueError(f"causal ring attention needs an even local length (two zigzag chunks), got {q.shape[2]}")
    return RingFlashAttention.apply(q, k, v, causal, softmax_scale, deterministic, group)
