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
program loops over that range only. Inside it, the tiles of the block's own document (block and tile
each all one id, the same) need no document mask: `document_ranges` also gives the first run of
such tiles, which the kernels loop over without loading a single id. For packed sequences (each
document one run of positions) that run is the document's interior; ids that come back to an
earlier document are still exact, the tiles outside the run computed under the mask.

The ranges are a dozen small torch ops, whose host time (~0.4 ms on the H200 machine) was more than
the kernels' own time for short documents; a training step hands the same ids to every layer's
attention, three launches each, so `resolve` keeps them per ids tensor (`documents_of`).
"""
from __future__ import annotations

import collections
import dataclasses
import threading

import torch


@dataclasses.dataclass(eq=False)
class Documents:
    """Document ids as the kernels read them (int32, contiguous) and their tile ranges, each tile
    shape's computed once (the forward and the two backward passes each have their own)."""

    ids: torch.Tensor
    _ranges: dict[tuple[int, int], torch.Tensor] = dataclasses.field(default_factory=dict)

    def ranges(self, block_own: int, block_other: int) -> torch.Tensor:
        key = (block_own, block_other)
        if key not in self._ranges:
            self._ranges[key] = document_ranges(self.ids, block_own, block_other)
        return self._ranges[key]


# the last few ids tensors seen, by memory, layout and version counter (see documents_of)
_RECENT: collections.OrderedDict[tuple, tuple[torch.Tensor, Documents]] = collections.OrderedDict()
_RECENT_KEPT = 8
_RECENT_LOCK = threading.Lock()  # the backward's launches run on autograd's thread


def documents_of(document_ids: torch.Tensor) -> Documents:
    """The kernels' form of `document_ids`, shared by every call with the same tensor: keyed by its
    memory, dtype, shape, strides and version counter (which every in-place write through PyTorch
    bumps), holding the tensor itself so its memory cannot pass to another tensor while kept."""
    if document_ids.is_inference():  # inference tensors keep no version counter: convert afresh
        return Documents(document_ids.to(torch.int32).contiguous())
    key = (document_ids.data_ptr(), document_ids.device, document_ids.dtype, tuple(document_ids.shape),
           document_ids.stride(), document_ids._version)
    with _RECENT_LOCK:
        kept = _RECENT.get(key)
        if kept is not None:
            _RECENT.move_to_end(key)
            return kept[1]
    docs = Documents(document_ids.to(torch.int32).contiguous())
    with _RECENT_LOCK:
        _RECENT[key] = (document_ids, docs)
        while len(_RECENT) > _RECENT_KEPT:
            _RECENT.popitem(last=False)
    return docs


@dataclasses.dataclass(frozen=True)
class KernelMask:
    """A mask in the kernels' form: CAUSAL (right = 0, no left bound), or WINDOW with finite bounds
    (causal folded into right), or neither; documents on top as int32 ids (batch, seqlen)."""

    causal: bool
    window: bool
    left: int
    right: int
    documents: Documents | None

    def kernel_args(self, block_own: int, block_other: int, tile_counter: torch.Tensor | None = None) -> dict:
        """Keyword arguments of a kernel whose programs own blocks of `block_own` positions (queries
        for the forward and dQ kernels, keys for the dK/dV kernel) and stream tiles of `block_other`."""
        docs = self.documents
        has_docs = docs is not None
        return dict(
            win_left=self.left, win_right=self.right,
            DOC=docs.ids if has_docs else None, stride_docb=docs.ids.stride(0) if has_docs else 0,
            DOC_RANGE=docs.ranges(block_own, block_other) if has_docs else None,
            TILES=tile_counter, CAUSAL=self.causal, WINDOW=self.window, DOCS=has_docs,
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
    docs = documents_of(document_ids) if document_ids is not None else None
    if left == -1 and right in (-1, 0):
        return KernelMask(right == 0, False, 0, 0, docs)
    unlimited = seqlen_q + seqlen_k  # past every position, and small enough for int32 index arithmetic
    return KernelMask(False, True, left if left >= 0 else unlimited, right if right >= 0 else unlimited, docs)


def _tile_min_max(ids: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, tiles) min and max of the ids in each tile of `block` positions."""
    batch, seqlen = ids.shape
    pad = -(-seqlen // block) * block - seqlen
    # pad with the last id: the padded positions do not exist, and repeating a real id keeps min/max
    tiles = torch.cat([ids, ids[:, -1:].expand(batch, pad)], 1).view(batch, -1, block)
    return tiles.amin(-1), tiles.amax(-1)


def document_ranges(ids: torch.Tensor, block_own: int, block_other: int) -> torch.Tensor:
    """int32 (batch, own blocks, 4): for each block of `block_own` positions, [lo, hi) from its first
    to its last tile of `block_other` positions whose ids' [min, max] overlaps its own, then
    [pure_lo, pure_hi): the first run of tiles all of the block's own single document (empty, 0 0,
    when the block mixes documents). Every block overlaps the tile holding its own positions, so
    [lo, hi) is never empty."""
    seqlen = ids.shape[1]
    own_min, own_max = _tile_min_max(ids, block_own)
    other_min, other_max = _tile_min_max(ids, block_other)
    overlap = (other_min[:, None, :] <= own_max[:, :, None]) & (other_max[:, None, :] >= own_min[:, :, None])
    overlap = overlap.to(torch.int8)  # (batch, own blocks, other tiles); argmax gives the first maximum
    first = overlap.argmax(-1)
    last = overlap.shape[-1] - 1 - overlap.flip(-1).argmax(-1)
    pure = (other_min == other_max)[:, None, :] & (other_min[:, None, :] == own_min[:, :, None]) & (own_min == own_max)[:, :, None]
    pure_first = pure.to(torch.int8).argmax(-1)
    tile = torch.arange(pure.shape[-1], device=ids.device)
    ends = (~pure & (tile > pure_first[..., None])).to(torch.int8)  # tiles after the run's start that leave it
    pure_end = torch.where(ends.any(-1), ends.argmax(-1), pure.shape[-1])
    has_pure = pure.any(-1)
    pure_lo = torch.where(has_pure, pure_first * block_other, 0)
    pure_hi = torch.where(has_pure, pure_end * block_other, 0).clamp(max=seqlen)
    lo = first * block_other
    hi = ((last + 1) * block_other).clamp(max=seqlen)
    return torch.stack([lo, hi, pure_lo, pure_hi], -1).to(torch.int32).contiguous()
