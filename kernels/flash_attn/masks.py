"""Host side of the masks: the causal flag, the sliding window and document ids, as the kernels take them.

The public convention (flash-attn's): query i sees key j iff i + offset − left <= j <= i + offset + right,
offset = seqlen_k − seqlen_q, −1 meaning unlimited on that side, causal capping right at 0; and, with
document ids, iff doc[i] == doc[j]. `resolve` brings a request to its cheapest kernel form: a window
that covers every key on a side is unlimited there, (−1, 0) is the causal mask, and whatever window
remains reaches the kernels as WINDOW with both bounds finite (an unlimited side becomes a bound past
every position), so the kernels' arithmetic has no special cases.

Documents: for each program's block the kernels need the positions of the tiles its documents can
reach. From per-tile min/max of the ids, a tile pair can hold a visible element only if the two
[min, max] ranges overlap; `document_ranges` gives each block its first and last such tile, and the
program loops over that range only. For packed sequences (each document one run of positions) every
tile inside the range overlaps; ids that come back to an earlier document are still exact, their
interior tiles computed under the mask.
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class KernelMask:
    """A mask in the kernels' form: CAUSAL (right = 0, no left bound), or WINDOW with finite bounds
    (causal folded into right), or neither; documents on top as int32 ids (batch, seqlen)."""

    causal: bool
    window: bool
    left: int
    right: int
    document_ids: torch.Tensor | None

    def kernel_args(self, block_own: int, block_other: int, tile_counter: torch.Tensor | None = None) -> dict:
        """Keyword arguments of a kernel whose programs own blocks of `block_own` positions (queries
        for the forward and dQ kernels, keys for the dK/dV kernel) and stream tiles of `block_other`."""
        ids = self.document_ids
        return dict(
            win_left=self.left, win_right=self.right,
            DOC=ids, stride_docb=ids.stride(0) if ids is not None else 0,
            DOC_RANGE=document_ranges(ids, block_own, block_other) if ids is not None else None,
            TILES=tile_counter, CAUSAL=self.causal, WINDOW=self.window, DOCS=ids is not None,
            COUNT_TILES=tile_counter is not None,
        )


def resolve(causal: bool, window_size: tuple[int, int], document_ids: torch.Tensor | None,
            seqlen_q: int, seqlen_k: int) -> KernelMask:
    """The kernel form of (causal, window_size, document_ids); inputs already checked."""
    left, right = window_size
    if causal:
        right = 0
    # a side that reaches past every key is unlimited: row i's window covers key 0 once
    # left >= i + offset for every i (left >= seqlen_k − 1), the last key once right >= seqlen_q − 1
    if left >= seqlen_k - 1:
        left = -1
    if right >= seqlen_q - 1:
        right = -1
    ids = document_ids.to(torch.int32).contiguous() if document_ids is not None else None
    if left == -1 and right in (-1, 0):
        return KernelMask(right == 0, False, 0, 0, ids)
    unlimited = seqlen_q + seqlen_k  # past every position, and small enough for int32 index arithmetic
    return KernelMask(False, True, left if left >= 0 else unlimited, right if right >= 0 else unlimited, ids)


def _tile_min_max(ids: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, tiles) min and max of the ids in each tile of `block` positions."""
    batch, seqlen = ids.shape
    pad = -(-seqlen // block) * block - seqlen
    # pad with the last id: the padded positions do not exist, and repeating a real id keeps min/max
    tiles = torch.cat([ids, ids[:, -1:].expand(batch, pad)], 1).view(batch, -1, block)
    return tiles.amin(-1), tiles.amax(-1)


def document_ranges(ids: torch.Tensor, block_own: int, block_other: int) -> torch.Tensor:
    """int32 (batch, own blocks, 2): for each block of `block_own` positions, the positions [lo, hi)
    from its first to its last tile of `block_other` positions whose ids' [min, max] overlaps its own.
    Every block overlaps the tile holding its own positions, so the range is never empty."""
    seqlen = ids.shape[1]
    own_min, own_max = _tile_min_max(ids, block_own)
    other_min, other_max = _tile_min_max(ids, block_other)
    overlap = (other_min[:, None, :] <= own_max[:, :, None]) & (other_max[:, None, :] >= own_min[:, :, None])
    overlap = overlap.to(torch.int8)  # (batch, own blocks, other tiles); argmax gives the first maximum
    first = overlap.argmax(-1)
    last = overlap.shape[-1] - 1 - overlap.flip(-1).argmax(-1)
    lo = first * block_other
    hi = ((last + 1) * block_other).clamp(max=seqlen)
    return torch.stack([lo, hi], -1).to(torch.int32).contiguous()
