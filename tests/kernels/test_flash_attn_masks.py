"""Sliding-window and document masks: the kernel against float64 (the exactness rule), which tiles
each kernel visits (counted by the kernels themselves), the FLOP count of the visible pairs, and
the inputs refused. Interpreter-sized: N <= 512, few heads; `-m "not slow"` runs a few cases."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from _attention_checks import DEVICE, check_against_reference, make_qkv, poisoned_outputs, run_fwd_bwd  # noqa: F401
from torch.utils.flop_counter import FlopCounterMode

from kernels import attention_flops, flash_attention
from kernels.flash_attn import launch
from kernels.flash_attn.masks import document_ranges, resolve
from kernels.flops import visible_pairs
from kernels.reference import attention_mask


def doc_ids(*lengths: int) -> torch.Tensor:
    """One row of ids: document d repeated lengths[d] times."""
    return torch.cat([torch.full((n,), d, dtype=torch.int64) for d, n in enumerate(lengths)]).to(DEVICE)


# (seqlen_q, seqlen_k, window, causal, schedule): left 0, 1, 7, 64, > seqlen; right 0, 3, unlimited;
# seqlen_q != seqlen_k both ways (rows whose window holds no key: 150 × 70, right 0)
WINDOWS = [
    (100, 100, (7, -1), True, "two_pass"),
    (100, 100, (1, 3), False, "fused"),
    (100, 100, (0, 0), False, "two_pass"),
    (100, 100, (64, 3), True, "fused"),
    (100, 100, (300, 3), False, "two_pass"),
    (100, 100, (-1, 3), False, "fused"),
    (70, 150, (7, 3), False, "two_pass"),
    (70, 150, (64, 0), True, "fused"),
    (150, 70, (1, 0), False, "fused"),
    (150, 70, (7, 3), True, "two_pass"),
]
FAST_WINDOWS = [WINDOWS[0], WINDOWS[8]]


@pytest.mark.parametrize("seqlen_q, seqlen_k, window, causal, schedule", [
    pytest.param(*case, id="q{}-k{}-w{}:{}-{}-{}".format(case[0], case[1], *case[2], "causal" if case[3] else "full", case[4]),
                 marks=() if case in FAST_WINDOWS else pytest.mark.slow) for case in WINDOWS])
@pytest.mark.usefixtures("poisoned_outputs")
def test_window_matches_float64_reference(seqlen_q, seqlen_k, window, causal, schedule):
    q, k, v = make_qkv(1, 2, 1, seqlen_q, seqlen_k, 16, torch.bfloat16)  # GQA 2:1
    check_against_reference(q, k, v, causal, schedule=schedule, window_size=window)


# documents of lengths 1, 2, 17, 100; one document over the whole row; many short ones; and ids
# that come back to an earlier document (tiles inside the range that see nothing)
DOCUMENTS = {
    "lengths-17-1-2-100": (doc_ids(17, 1, 2, 100, 10), doc_ids(130)),
    "many-short": (doc_ids(*[3] * 43, 1), doc_ids(*[5] * 26)),
    "returning-ids": (torch.tensor([5] * 60 + [2] * 40 + [5] * 30, device=DEVICE), doc_ids(64, 66)),
}
DOC_CASES = [
    ("lengths-17-1-2-100", True, (-1, -1), "two_pass"), ("lengths-17-1-2-100", False, (20, 3), "fused"),
    ("many-short", True, (7, -1), "fused"), ("many-short", False, (-1, -1), "two_pass"),
    ("returning-ids", True, (-1, -1), "two_pass"), ("returning-ids", False, (20, 3), "fused"),
]
FAST_DOCS = [DOC_CASES[0], DOC_CASES[2]]


@pytest.mark.parametrize("name, causal, window, schedule", [
    pytest.param(*case, id="{}-{}-w{}:{}-{}".format(case[0], "causal" if case[1] else "full", *case[2], case[3]),
                 marks=() if case in FAST_DOCS else pytest.mark.slow) for case in DOC_CASES])
@pytest.mark.usefixtures("poisoned_outputs")
def test_documents_match_float64_reference(name, causal, window, schedule):
    ids = torch.stack(DOCUMENTS[name])
    q, k, v = make_qkv(2, 2, 1, 130, 130, 16, torch.bfloat16)
    check_against_reference(q, k, v, causal, schedule=schedule, window_size=window, document_ids=ids)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_documents_at_head_dim_64_the_register_capped_variants(causal):
    # d=64, 16-bit: on a GPU the forward and dQ kernels' document variants run under DOCUMENT_MAXNREG
    # (spilling a few bytes); the interpreter runs the same variants uncapped
    q, k, v = make_qkv(1, 2, 2, 300, 300, 64, torch.bfloat16)
    ids = doc_ids(1, 130, 17, 152)[None]
    check_against_reference(q, k, v, causal, schedule="two_pass", document_ids=ids)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.float16, marks=pytest.mark.slow)], ids=["float32", "float16"])
def test_documents_and_window_in_other_dtypes(dtype):
    q, k, v = make_qkv(1, 2, 2, 100, 100, 16, dtype)
    ids = doc_ids(40, 1, 59)[None]
    check_against_reference(q, k, v, True, window_size=(9, -1), document_ids=ids)


@pytest.mark.usefixtures("poisoned_outputs")
def test_rows_outside_every_window_give_zeros_and_zero_gradients():
    # 150 queries, 70 keys, window (3, 0): query i sees keys [i − 83, i − 80], so rows 0..79 see none
    q, k, v = make_qkv(1, 2, 1, 150, 70, 16, torch.float32)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    out, (dq, dk, dv) = run_fwd_bwd(flash_attention, q, k, v, do, window_size=(3, 0))
    assert torch.equal(out[:, :, :80], torch.zeros_like(out[:, :, :80]))
    assert torch.equal(dq[:, :, :80], torch.zeros_like(dq[:, :, :80]))
    assert out[:, :, 80:].abs().amax(-1).gt(0).all() and not dk.isnan().any()


# ----------------------------------------------------------------------------------------------
# Tile skipping, counted by the kernels (each visited tile adds 1 to a counter)
# ----------------------------------------------------------------------------------------------


def visited_tiles(q, k, v, causal, window, ids, tiles=None) -> dict[str, tuple[int, tuple[int, int]]]:
    """Per kernel: the tiles it visits (per program: key blocks in the forward and dQ pass, query
    blocks in the dK/dV pass), summed over programs and heads, and its tile (query rows, keys):
    the table's (the GPU's, or the interpreter's 64×64), or `tiles` where given."""
    counts = {}
    kw = dict(window_size=window, document_ids=ids)
    block_d = max(16, q.shape[-1])

    def count(name, fn, *args):
        config = launch.kernel_config(name, block_d, q.dtype, causal)
        if tiles is not None:
            config = dataclasses.replace(config, BLOCK_M=tiles[0], BLOCK_N=tiles[1])
        counter = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        result = fn(*args, causal, q.shape[-1] ** -0.5, config, **kw, tile_counter=counter)
        counts[name] = int(counter.item()), (config.BLOCK_M, config.BLOCK_N)
        return result

    o, lse2 = count("fwd", launch.forward, q, k, v)
    do = torch.randn_like(q)
    _, delta = count("bwd_dq", launch.backward_dq, do, q, k, v, o, lse2)
    count("bwd_dkdv", launch.backward_dkdv, do, q, k, v, lse2, delta)
    count("bwd_fused", launch.backward_fused, do, q, k, v, lse2, delta)
    return counts


def tiles_with_a_visible_pair(seqlen, causal, window, ids, tile=(64, 64)) -> int:
    """(query block, key block) tiles of shape `tile` that hold at least one visible pair."""
    mask = attention_mask(seqlen, seqlen, causal, window, ids[None] if ids is not None else None)
    mask = torch.ones(seqlen, seqlen, dtype=torch.bool) if mask is None else mask.reshape(seqlen, seqlen)
    rows, cols = tile
    return int(mask.reshape(seqlen // rows, rows, seqlen // cols, cols).any(3).any(1).sum())


@pytest.mark.parametrize("seqlen, causal, window, lengths", [
    pytest.param(512, False, (-1, -1), [64] * 8, id="8-equal-documents"),
    pytest.param(512, True, (-1, -1), [64] * 8, id="8-equal-documents-causal", marks=pytest.mark.slow),
    pytest.param(256, False, (-1, -1), [50, 3, 100, 17, 86], id="documents-unaligned", marks=pytest.mark.slow),
    pytest.param(256, True, (64, -1), None, id="window-64-causal"),
    pytest.param(256, False, (10, 70), None, id="window-10-70", marks=pytest.mark.slow),
    pytest.param(256, True, (-1, -1), None, id="causal-the-control", marks=pytest.mark.slow),
])
def test_kernels_visit_only_tiles_that_hold_a_visible_pair(seqlen, causal, window, lengths):
    # at the table's tiles: the interpreter's 64×64, on a GPU the float32 entries (64×32, 32×32)
    ids = doc_ids(*lengths) if lengths else None
    q, k, v = make_qkv(1, 1, 1, seqlen, seqlen, 16, torch.float32, requires_grad=False)
    counts = visited_tiles(q, k, v, causal, window, ids[None] if ids is not None else None)
    expected = {name: tiles_with_a_visible_pair(seqlen, causal, window, ids, tile) for name, (_, tile) in counts.items()}
    assert {name: n for name, (n, _) in counts.items()} == expected, f"visited {counts}, tiles with a visible pair: {expected}"
    if lengths == [64] * 8:  # 8 equal documents: 1/8 of the 64×64 tiles
        assert tiles_with_a_visible_pair(seqlen, causal, window, ids) == (64 if causal else 64) // 8


@pytest.mark.slow
def test_tiles_visited_at_rectangular_tiles():
    # the GPU's tiles are not square (e.g. 32 query rows × 64 keys): the count follows the tile shape
    ids = doc_ids(50, 3, 100, 17, 86)
    q, k, v = make_qkv(1, 1, 1, 256, 256, 16, torch.float32, requires_grad=False)
    for tile in ((32, 64), (64, 32)):
        counts = visited_tiles(q, k, v, True, (40, -1), ids[None], tiles=tile)
        expected = tiles_with_a_visible_pair(256, True, (40, -1), ids, tile)
        assert {name: n for name, (n, _) in counts.items()} == dict.fromkeys(counts, expected), (tile, counts)


def test_document_register_cap_goes_to_the_document_variants_only(monkeypatch):
    # DOCUMENT_MAXNREG caps the registers of a kernel's document variant on the GPU (two programs
    # per SM instead of one); the plain variants and the interpreter never see it
    monkeypatch.setattr(launch, "DOCUMENT_MAXNREG", {("fwd", "d64", "16bit"): 128})
    launch._table_config.cache_clear()
    try:
        on_gpu = launch._table_config("fwd", 64, torch.bfloat16, True, True, False)
        assert on_gpu.maxnreg == 128 and on_gpu.launch_kwargs()["maxnreg"] == 128
        plain = launch._table_config("fwd", 64, torch.bfloat16, True, False, False)
        assert plain.maxnreg is None and "maxnreg" not in plain.launch_kwargs()
        assert launch._table_config("bwd_dq", 64, torch.bfloat16, True, True, False).maxnreg is None  # no entry
        assert launch._table_config("fwd", 64, torch.bfloat16, True, True, True).maxnreg is None  # interpreter
    finally:
        launch._table_config.cache_clear()
    # a capped config launches and changes nothing but registers (the interpreter ignores the cap)
    q, k, v = make_qkv(1, 2, 2, 80, 80, 32, torch.float32, requires_grad=False)
    ids = torch.repeat_interleave(torch.arange(4), 20)[None].to(q.device)
    table = launch.kernel_config("fwd", 32, q.dtype, True, True)
    plain_o, _ = launch.forward(q, k, v, True, 0.2, document_ids=ids)
    capped_o, _ = launch.forward(q, k, v, True, 0.2, config=dataclasses.replace(table, maxnreg=128), document_ids=ids)
    assert torch.equal(plain_o, capped_o)


def test_document_ranges_from_tile_min_max():
    ids = doc_ids(100, 3, 200, 17, 192)[None]  # boundaries at 100, 103, 303, 320
    ranges = document_ranges(ids, 64, 64)[0].tolist()
    # query block 1 (rows 64..127) holds documents 0, 1, 2: keys 0..302, i.e. tiles 0..4; it mixes
    # documents, so no tile is all its own document (empty run, 0 0)
    assert ranges[1] == [0, 320, 0, 0]
    # block 2 (rows 128..191) lies inside document 2 (103..302): tiles 1..4 reach it, tiles 2 and 3
    # are all document 2 (tile 4 holds document 3's start)
    assert ranges[2] == [64, 320, 128, 256]
    assert ranges[7] == [320, 512, 320, 512]  # block 7 lies inside the last document, which starts at 320
    assert document_ranges(ids, 32, 128)[0, 0].tolist() == [0, 128, 0, 0]  # tile 0 holds documents 0 and 1
    # ids that come back to an earlier document: the run is the first one only
    back = torch.tensor([[5] * 64 + [6] * 64 + [5] * 128])
    assert document_ranges(back, 64, 64)[0, 0].tolist() == [0, 256, 0, 64]


def test_documents_kept_per_ids_tensor():
    ids = doc_ids(30, 34)[None]
    first = resolve(True, (-1, -1), ids, 64, 64).documents
    assert resolve(True, (-1, -1), ids, 64, 64).documents is first  # the same tensor: converted and ranged once
    assert first.ranges(64, 64) is first.ranges(64, 64)
    ids[0, 40] = 0  # an in-place write bumps the version counter: computed afresh
    assert resolve(True, (-1, -1), ids, 64, 64).documents is not first
    assert resolve(True, (-1, -1), ids.clone(), 64, 64).documents is not first
    with torch.inference_mode():
        frozen = doc_ids(30, 34)[None]
    assert resolve(True, (-1, -1), frozen, 64, 64).documents.ids.dtype == torch.int32


def test_resolve_brings_masks_to_their_cheapest_form():
    assert resolve(False, (-1, 0), None, 100, 100).causal  # (−1, 0) is the causal mask
    assert not resolve(False, (99, -1), None, 100, 100).window  # a window past every key: no mask
    assert resolve(True, (7, 5), None, 100, 100) == resolve(False, (7, 0), None, 100, 100)  # causal caps right at 0
    mask = resolve(False, (7, -1), None, 50, 80)
    assert mask.window and mask.left == 7 and mask.right >= 80 + 50  # the unlimited side: past every position


# ----------------------------------------------------------------------------------------------
# FLOPs over the visible pairs
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, window", [
    (40, 40, True, (5, -1)), (40, 40, False, (3, 7)), (30, 50, True, (9, 2)), (50, 30, False, (0, 4)), (40, 40, False, (80, -1)),
])
def test_visible_pairs_count_the_mask(seqlen_q, seqlen_k, causal, window):
    ids = doc_ids(7, 1, 2, 20, 10)[:seqlen_q]
    assert visible_pairs(seqlen_q, seqlen_k, causal, window) == int(attention_mask(seqlen_q, seqlen_k, causal, window).sum())
    if seqlen_q == seqlen_k:
        both = torch.stack([ids, ids.flip(0)])
        assert visible_pairs(seqlen_q, seqlen_k, causal, window, both) == int(attention_mask(seqlen_q, seqlen_k, causal, window, both).sum())


def test_flop_counter_reports_the_visible_pairs():
    q, k, v = make_qkv(2, 2, 1, 96, 96, 16, torch.float32)
    ids = torch.stack([doc_ids(30, 66), doc_ids(1, 95)])
    with FlopCounterMode(display=False) as counter:
        flash_attention(q, k, v, causal=True, window_size=(20, -1), document_ids=ids).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    pairs = int(attention_mask(96, 96, True, (20, -1), ids).sum())
    assert counts[torch.ops.flashgpt.flash_attn_fwd] == 4 * 2 * pairs * 16  # 2 heads
    assert counts[torch.ops.flashgpt.flash_attn_bwd] == 10 * 2 * pairs * 16
    assert attention_flops(2, 2, 96, 96, 16, True, "fwd", (20, -1), ids) == 4 * 2 * pairs * 16


# ----------------------------------------------------------------------------------------------
# Bad mask arguments: refused before any launch, naming the argument
# ----------------------------------------------------------------------------------------------

BAD_MASKS = {
    "window-one-value": (dict(window_size=(3,)), TypeError, "window_size must be a pair of ints"),
    "window-float": (dict(window_size=(1.5, 2)), TypeError, "window_size must be a pair of ints"),
    "window-bool": (dict(window_size=(True, 2)), TypeError, "window_size must be a pair of ints"),
    "window-int": (dict(window_size=4), TypeError, "window_size must be a pair of ints"),
    "window-below-minus-one": (dict(window_size=(-2, 0)), ValueError, "window_size values must be >= -1"),
    "ids-float": (dict(document_ids=torch.zeros(2, 8)), TypeError, "document_ids must hold integers"),
    "ids-bool": (dict(document_ids=torch.zeros(2, 8, dtype=torch.bool)), TypeError, "document_ids must hold integers"),
    "ids-list": (dict(document_ids=[[0] * 8] * 2), TypeError, "document_ids must be a torch.Tensor"),
    "ids-shape": (dict(document_ids=torch.zeros(8, dtype=torch.int64)), ValueError, r"document_ids must have shape \(batch, seqlen\)"),
    "ids-meta": (dict(document_ids=torch.zeros(2, 8, dtype=torch.int64, device="meta")), ValueError, "document_ids is on meta"),
}


@pytest.mark.parametrize("kwargs, error, message", BAD_MASKS.values(), ids=BAD_MASKS.keys())
def test_bad_masks_fail_before_any_launch(kwargs, error, message, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel was launched before the input was rejected")

    monkeypatch.setattr(launch, "forward", no_launch)
    q, k, v = make_qkv(2, 2, 2, 8, 8, 16, torch.float32)
    with pytest.raises(error, match=message):
        flash_attention(q, k, v, **kwargs)


def test_documents_need_equal_query_and_key_lengths():
    q, k, v = make_qkv(1, 1, 1, 8, 12, 16, torch.float32)
    with pytest.raises(ValueError, match="document_ids needs seqlen_q == seqlen_k"):
        flash_attention(q, k, v, document_ids=torch.zeros(1, 8, dtype=torch.int64))
