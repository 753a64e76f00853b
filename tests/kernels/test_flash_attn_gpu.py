"""Every launch-config class of the kernel on a real GPU, against float64 (the exactness rule).

The CPU interpreter runs any config: only the GPU compiler can fail on one (a pipelined loop
whose trip count the compiler knows to be tiny, a tile that does not fit), and only at the shapes
that pick that config. So this sweeps what picks a config: each head-dim bucket (the padded
BLOCK_D 16, 32, 64, 128, 256, with dims that are not powers of two), query lengths from 1 (the
value Triton specialises as a constant) to beyond a block, key lengths below, between and above
the blocks, MHA/GQA/MQA, the three dtypes, causal and not, TMA loads as the table picks them and
forced off, and both backward schedules; then the same under sliding windows and document ids
(test_masks_on_gpu). Skipped without CUDA; ~1200 cases, run with -n.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from _attention_checks import assert_within_rule, check_against_reference, launch_table_changed, make_qkv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: only the GPU compiler can reject a launch config"),
]

HEAD_DIMS = [13, 24, 40, 59, 80, 96, 111, 200]  # buckets 1-16, 17-32, 33-64, 65-128, 129-256 (BLOCK_D 16..256)
SEQLENS_Q = [1, 2, 17, 113, 255]
SEQLENS_K = [1, 239, 1024]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _cases():
    for i, (d, sq, sk, dtype, causal) in enumerate(itertools.product(HEAD_DIMS, SEQLENS_Q, SEQLENS_K, DTYPES, [False, True])):
        heads = HEADS[i % len(HEADS)]  # every head ratio meets every head dim and length, over the sweep
        tma = "off" if (dtype == torch.bfloat16 and i % 2) else "table"
        yield pytest.param(d, sq, sk, heads, dtype, causal, tma,
                           id=f"d{d}-q{sq}-k{sk}-h{heads[0]}:{heads[1]}-{str(dtype)[6:]}-{'causal' if causal else 'full'}-tma_{tma}")


@pytest.mark.parametrize("head_dim,seqlen_q,seqlen_k,heads,dtype,causal,tma", list(_cases()))
def test_shape_class_on_gpu(head_dim, seqlen_q, seqlen_k, heads, dtype, causal, tma):
    q, k, v = make_qkv(1, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype)
    with launch_table_changed(lambda name, config: dict(TMA=False, TMA_DQ=False) if tma == "off" else {}):
        for schedule in ("two_pass", "fused"):
            check_against_reference(q, k, v, causal, schedule=schedule)


# Masks on the GPU: every head-dim bucket and dtype under sliding windows and document ids, with
# lengths below, at and beyond the blocks, both schedules, TMA as the table picks it and forced off.
MASK_WINDOWS = [(0, 0), (1, 3), (64, -1), (127, 0), (1024, 5), (-1, 3)]
MASK_DOCUMENTS = ["none", "few", "many", "returning"]


def _documents(kind: str, batch: int, seqlen: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    pos = torch.arange(seqlen, device="cuda")
    if kind == "few":  # boundaries that are not multiples of any block
        ids = (pos >= seqlen // 3).long() + (pos >= seqlen // 3 + 17).long() + (pos >= seqlen - 1).long()
    elif kind == "many":
        ids = pos // 7
    else:  # a document that comes back after another one
        ids = ((pos // 50) % 2).long()
    return ids.expand(batch, seqlen).contiguous()


def _mask_cases():
    shapes = [(1, 1), (17, 17), (255, 255), (1000, 1000), (113, 1024), (1024, 239)]
    for i, (d, (sq, sk), window, kind, dtype, causal) in enumerate(itertools.product(
            [24, 64, 111, 200], shapes, MASK_WINDOWS, MASK_DOCUMENTS, DTYPES, [False, True])):
        if kind != "none" and sq != sk:
            continue  # documents need seqlen_q == seqlen_k
        if i % 6:  # a sixth of the product (~430 cases); the factors still meet in pairs across the sweep
            continue
        heads = HEADS[i % len(HEADS)]
        tma = "off" if (dtype == torch.bfloat16 and i % 2) else "table"
        yield pytest.param(d, sq, sk, heads, dtype, causal, window, kind, tma,
                           id=f"d{d}-q{sq}-k{sk}-h{heads[0]}:{heads[1]}-{str(dtype)[6:]}-{'causal' if causal else 'full'}"
                              f"-w{window[0]}:{window[1]}-docs_{kind}-tma_{tma}")


@pytest.mark.parametrize("head_dim,seqlen_q,seqlen_k,heads,dtype,causal,window,documents,tma", list(_mask_cases()))
def test_masks_on_gpu(head_dim, seqlen_q, seqlen_k, heads, dtype, causal, window, documents, tma):
    q, k, v = make_qkv(2, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype)
    ids = _documents(documents, 2, seqlen_q)
    with launch_table_changed(lambda name, config: dict(TMA=False) if tma == "off" else {}):
        for schedule in ("two_pass", "fused"):
            check_against_reference(q, k, v, causal, schedule=schedule, window_size=window, document_ids=ids)


def test_compiled_kernels_are_reused_exactly():
    # kernels/flash_attn/fast_launch.py: the first call of a shape binds through Triton, the next ones
    # launch the compiled kernels directly; both must pass the exactness rule, and a misaligned view
    # must get a kernel of its own (Triton specialises on 16-byte alignment)
    import triton

    from kernels.flash_attn import fast_launch, launch
    from kernels.reference import attention_reference

    if not fast_launch.enabled():
        pytest.skip(f"fast_launch is off here (triton {triton.__version__}, checked: {fast_launch.CHECKED_TRITON})")
    kernels = (launch.fwd_kernel, launch.bwd_dq_kernel, launch.bwd_kv_kernel)
    for causal in (False, True):
        sizes = []
        for _ in range(2):
            q, k, v = make_qkv(2, 4, 2, 200, 333, 64, torch.bfloat16)
            check_against_reference(q, k, v, causal)  # the two-pass backward: forward, dQ and dK/dV kernels
            sizes.append([len(fast_launch._COMPILED[kern, torch.cuda.current_device()].by_key) for kern in kernels])
        assert sizes[0] == sizes[1] and min(sizes[1]) >= 1  # the second round found every key
    # check_against_reference copies its inputs into fresh (aligned) leaves, so the misaligned view
    # goes to the launcher directly: it must get a kernel of its own and still be exact
    flat = torch.randn(1 + 2 * 4 * 200 * 64, device="cuda", dtype=torch.bfloat16)
    q = flat[1:].view(2, 4, 200, 64)  # 2 bytes past an aligned address
    assert q.data_ptr() % 16 != 0
    _, k, v = make_qkv(2, 4, 2, 200, 333, 64, torch.bfloat16, requires_grad=False)
    out = launch.forward(q, k, v, True, 64 ** -0.5)[0]
    launch.forward(q.clone(), k, v, True, 64 ** -0.5)  # and an aligned copy, for the kernel it gets
    assert_within_rule("O", out, attention_reference(q, k, v, True), attention_reference(q, k, v, True, dtype=None), 2.0)
    by_key = fast_launch._COMPILED[launch.fwd_kernel, torch.cuda.current_device()].by_key
    kernels_by_alignment = {}  # q's 16-byte alignment -> the compiled kernels launched for it
    for (_, spec, _), kernel in by_key.items():
        kernels_by_alignment.setdefault(spec[0][1], set()).add(id(kernel))
    assert set(kernels_by_alignment) == {True, False} and not kernels_by_alignment[True] & kernels_by_alignment[False]
