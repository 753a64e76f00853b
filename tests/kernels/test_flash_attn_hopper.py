"""The Hopper kernels in Gluon: the forward (kernels/flash_attn/forward_hopper.py) and the
single-pass backward (kernels/flash_attn/backward_hopper.py).

On CPU: when the launcher may and must not pick them, and what a user who forces one where it
can't run is told. On an sm_90 GPU: the float64 exactness rule over head dims 64 / 128, fp16 /
bf16, causal both ways, MHA / GQA / MQA, lengths that are not multiples of the blocks and Nq ≠ Nk,
strided inputs as the model passes them, and that the defaults run them where they are picked.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from _attention_checks import DEVICE, check_against_reference, make_qkv

from kernels import flash_attention
from kernels.flash_attn import launch
from kernels.reference import attention_mask, attention_reference

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
MIN_D64 = launch.HOPPER_MIN_SEQLEN[("d64", "16bit")]
FWD_MIN_D64 = launch.HOPPER_FORWARD_MIN_SEQLEN[("d64", "16bit")]


# ----------------------------------------------------------------------------------------------
# Dispatch (CPU): the rules on plain facts
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("capability,dtype,head_dim,documents,numel,reason", [
    (None, BF16, 64, False, 1, "CUDA GPU only"),
    ((8, 0), BF16, 64, False, 1, "sm_90 GPU"),
    ((10, 0), BF16, 128, False, 1, "sm_90 GPU"),  # Blackwell has no wgmma
    ((9, 0), FP32, 64, False, 1, "float16 / bfloat16"),
    ((9, 0), BF16, 80, False, 1, "head_dim 64 or 128, got 80"),
    ((9, 0), FP16, 256, False, 1, "head_dim 64 or 128"),
    ((9, 0), BF16, 64, True, 1, "not document ids"),
    ((9, 0), BF16, 64, False, 2**31, "below 2³¹"),
])
def test_hopper_reason_names_what_to_change(capability, dtype, head_dim, documents, numel, reason):
    assert reason in launch.hopper_reason(capability, dtype, head_dim, documents, numel)


def test_hopper_reason_accepts_what_the_kernel_takes(monkeypatch):
    monkeypatch.setattr(launch, "_gluon_available", lambda: True)
    for dtype, head_dim in itertools.product((BF16, FP16), (64, 128)):
        assert launch.hopper_reason((9, 0), dtype, head_dim, False, 2**31 - 1) is None
    monkeypatch.setattr(launch, "_gluon_available", lambda: False)
    assert "triton.experimental.gluon" in launch.hopper_reason((9, 0), BF16, 64, False, 1)


@pytest.mark.parametrize("capability,dtype,head_dim,seqlen_k,documents,expected", [
    ((9, 0), BF16, 64, MIN_D64, False, "hopper"),
    ((9, 0), FP16, 128, 1, False, "hopper"),           # d=128: ahead from the shortest length measured
    ((9, 0), BF16, 64, MIN_D64 - 1, False, "two_pass"),  # short d=64: the two passes measured faster
    ((9, 0), BF16, 64, 8192, True, "two_pass"),         # documents: the `tl` kernels
    ((9, 0), BF16, 96, 8192, False, "two_pass"),
    ((9, 0), FP32, 64, 8192, False, "two_pass"),
    ((8, 0), BF16, 64, 8192, False, "two_pass"),
    ((10, 0), BF16, 64, 8192, False, "two_pass"),
])
def test_gpu_schedule_picks_hopper_where_measured_ahead(monkeypatch, capability, dtype, head_dim, seqlen_k, documents,
                                                        expected):
    monkeypatch.setattr(launch, "_gluon_available", lambda: True)
    monkeypatch.setattr(launch, "FUSED_FASTER", {})
    assert launch.gpu_schedule(capability, dtype, head_dim, seqlen_k, documents, 1) == expected


@pytest.mark.parametrize("capability,dtype,head_dim,seqlen_k,documents,expected", [
    ((9, 0), BF16, 64, FWD_MIN_D64, False, "hopper"),
    ((9, 0), FP16, 128, 1, False, "hopper"),       # d=128: ahead from the shortest length measured
    ((9, 0), BF16, 64, FWD_MIN_D64 - 1, False, "tl"),  # short d=64: forward.py measured faster
    ((9, 0), BF16, 128, 8192, True, "tl"),          # documents: forward.py
    ((9, 0), BF16, 96, 8192, False, "tl"),
    ((9, 0), FP32, 128, 8192, False, "tl"),
    ((8, 0), BF16, 128, 8192, False, "tl"),
    ((10, 0), BF16, 128, 8192, False, "tl"),
])
def test_gpu_forward_kernel_picks_hopper_where_measured_ahead(monkeypatch, capability, dtype, head_dim, seqlen_k,
                                                              documents, expected):
    monkeypatch.setattr(launch, "_gluon_available", lambda: True)
    assert launch.gpu_forward_kernel(capability, dtype, head_dim, seqlen_k, documents, 1) == expected


def test_forward_kernel_is_checked_and_forcing_hopper_where_it_cannot_run_says_why():
    q, k, v = make_qkv(1, 1, 1, 8, 8, 64, BF16 if DEVICE == "cuda" else FP32, requires_grad=False)
    with pytest.raises(ValueError, match="kernel must be one of 'tl', 'hopper', 'fastest', got 'gluon'"):
        launch.forward(q, k, v, False, 0.125, kernel="gluon")
    if launch.hopper_unsupported(q, k) is None:
        pytest.skip("this GPU runs the Hopper kernel: nothing to refuse")
    with pytest.raises(ValueError, match="kernel='hopper' .*kernel='fastest'"):
        launch.forward(q, k, v, False, 0.125, kernel="hopper")
    assert launch.fastest_forward(q, k) == "tl"


def test_forcing_hopper_where_it_cannot_run_says_why():
    q, k, v = make_qkv(1, 1, 1, 8, 8, 64, BF16 if DEVICE == "cuda" else FP32, requires_grad=False)
    o, lse2 = launch.forward(q, k, v, False, 0.125)
    reason = launch.hopper_unsupported(q, k)
    if reason is None:
        pytest.skip("this GPU runs the Hopper kernel: nothing to refuse")
    with pytest.raises(ValueError, match="schedule='hopper' .*schedule='fastest'"):
        launch.backward(o, q, k, v, o, lse2, False, 0.125, schedule="hopper")


# ----------------------------------------------------------------------------------------------
# On an sm_90 GPU
# ----------------------------------------------------------------------------------------------
on_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
    or launch.hopper_reason((9, 0), BF16, 64, False, 1) is not None,
    reason="needs an sm_90 GPU and a triton with Gluon's Hopper API",
)

SHAPES = [(1, 1), (17, 239), (77, 77), (255, 1024), (1024, 255), (1000, 1000), (300, 2100)]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA


def _gpu_cases():
    for i, (d, dtype, causal, (nq, nk)) in enumerate(itertools.product((64, 128), (BF16, FP16), (False, True), SHAPES)):
        heads = HEADS[i % len(HEADS)]
        yield pytest.param(d, dtype, causal, nq, nk, heads,
                           id=f"d{d}-{str(dtype)[6:]}-{'causal' if causal else 'full'}-q{nq}-k{nk}-h{heads[0]}:{heads[1]}")


@pytest.fixture(params=[True, False], ids=["strided_tma", "contiguous_copies"])
def strided(request, monkeypatch):
    """The launch table's configs (STRIDED: 4-D descriptors over the inputs' own strides), and the
    same with STRIDED off (2-D descriptors over contiguous copies), the A/B's other side."""
    for table in ("HOPPER_BACKWARD", "HOPPER_BACKWARD_WINDOW"):
        monkeypatch.setattr(launch, table, {key: dataclasses.replace(cfg, STRIDED=request.param)
                                            for key, cfg in getattr(launch, table).items()})
    return request.param


def test_window_calls_take_their_own_backward_config():
    # HOPPER_BACKWARD's config with or without causal; HOPPER_BACKWARD_WINDOW's (64 rows at d=64) under a window
    for d in (64, 128):
        key = launch._table_key(d, BF16)
        assert launch.hopper_backward_config(d, BF16, window=False) == launch.HOPPER_BACKWARD[key]
        expected = launch.HOPPER_BACKWARD_WINDOW.get(key, launch.HOPPER_BACKWARD[key])
        assert launch.hopper_backward_config(d, BF16, window=True) == expected
    assert launch.hopper_backward_config(64, BF16, window=False).BLOCK_M == 128
    assert launch.hopper_backward_config(64, BF16, window=True).BLOCK_M == 64
    assert launch.hopper_backward_config(128, BF16, window=False).BLOCK_M == 64  # 128 rows don't fit at d=128


def test_backward_passes_the_window_config_only_under_a_window(monkeypatch):
    # launch.backward's pick between the two tables, on meta tensors: the Gluon launcher is replaced
    from kernels.flash_attn import backward_hopper

    configs = []
    monkeypatch.setattr(backward_hopper, "backward_hopper", lambda *args, **kw: configs.append(args[8]) or (None,) * 3)
    monkeypatch.setattr(launch, "backward_delta", lambda o, do: None)
    monkeypatch.setattr(launch, "hopper_unsupported", lambda *args, **kw: None)  # meta tensors: no GPU to ask
    q = torch.empty(1, 1, 8, 64, dtype=BF16, device="meta")
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (16, 0)), (False, (4, 4))):
        launch.backward(q, q, q, q, q, q, causal, 0.125, "hopper", window)
        assert configs[-1] == launch.hopper_backward_config(64, BF16, window=window != (-1, -1))
    assert [c.BLOCK_M for c in configs] == [128, 128, 64, 64]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim,dtype,causal,seqlen_q,seqlen_k,heads", list(_gpu_cases()))
def test_hopper_backward_is_exact(head_dim, dtype, causal, seqlen_q, seqlen_k, heads, strided):
    q, k, v = make_qkv(2, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype)
    check_against_reference(q, k, v, causal, schedule="hopper")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("batch,heads,seqlen_q,seqlen_k", [(1, (5, 5), 1000, 1000), (3, (4, 2), 700, 900)])
def test_hopper_backward_heavy_first_order_visits_every_key_block(monkeypatch, batch, heads, seqlen_q, seqlen_k):
    # 1 MB head groups at these lengths: groups of 2-4 (batch, kv head) pairs and a smaller last
    # one, so every branch of the causal launch order runs; a key block missed or visited twice
    # would leave dK / dV wrong
    monkeypatch.setattr(launch, "HOPPER_BACKWARD",
                        {key: dataclasses.replace(cfg, L2_GROUP_MB=1) for key, cfg in launch.HOPPER_BACKWARD.items()})
    for head_dim in (64, 128):
        q, k, v = make_qkv(batch, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, BF16)
        check_against_reference(q, k, v, True, schedule="hopper")


def strided_qkv(layout: str, head_dim: int, batch: int = 2, seqlen: int = 333, heads: int = 4) -> torch.Tensor:
    """q, k, v (stacked) in a layout that is not contiguous. qkv_views: the model's, views of one
    (B, N, 3, H, D) projection (not dense); bnhd: dense (B, N, H, D) tensors seen as (B, H, N, D), as
    torch.compile may hand them over; d_strided: head_dim not the unit-stride dimension."""
    if layout == "qkv_views":
        qkv = torch.randn(batch, seqlen, 3, heads, head_dim, device="cuda", dtype=BF16).permute(2, 0, 3, 1, 4)
    elif layout == "bnhd":
        qkv = torch.randn(3, batch, seqlen, heads, head_dim, device="cuda", dtype=BF16).transpose(2, 3)
    else:
        qkv = torch.randn(3, batch, heads, head_dim, seqlen, device="cuda", dtype=BF16).transpose(3, 4)
    assert not qkv[0].is_contiguous()
    return qkv


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("layout", ["qkv_views", "bnhd", "d_strided"])
def test_hopper_backward_takes_strided_inputs(head_dim, layout, strided):
    q, k, v = (t.detach().requires_grad_() for t in strided_qkv(layout, head_dim))
    check_against_reference(q, k, v, True, schedule="hopper")


def spy(monkeypatch, module, name: str) -> list:
    """module.name still runs, and each call appends to the returned list (clear it between checks)."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.gpu
@on_hopper
def test_default_backward_runs_hopper_where_picked(monkeypatch):
    from kernels.flash_attn import backward_hopper

    calls = spy(monkeypatch, backward_hopper, "backward_hopper")
    for seqlen, picked in ((MIN_D64, True), (MIN_D64 // 2, False)):
        calls.clear()
        q, k, v = make_qkv(1, 2, 2, seqlen, seqlen, 64, BF16)
        flash_attention(q, k, v, causal=True, deterministic=False).sum().backward()
        assert bool(calls) == picked, seqlen
        calls.clear()
        flash_attention(q, k, v, causal=True, deterministic=True).sum().backward()
        assert not calls  # the deterministic schedule is the `tl` two-pass one


@pytest.mark.gpu
@on_hopper
def test_hopper_backward_returns_the_layouts_the_fake_kernel_promises(strided):
    # torch.compile trusts the op's fake kernel (torch.empty_like of q, k, v): the real gradients
    # must come back in those layouts, whatever layout the inputs arrive in
    from kernels.flash_attn.op import flash_attn_bwd, flash_attn_fwd

    batch, seqlen, heads, head_dim = 2, 333, 4, 64
    projected = torch.randn(batch, seqlen, 3, heads, head_dim, device="cuda", dtype=BF16)
    strided = projected.permute(2, 0, 3, 1, 4)  # the model's views: not dense
    dense_bnhd = torch.randn(3, batch, seqlen, heads, head_dim, device="cuda", dtype=BF16).transpose(2, 3)  # dense, permuted
    for q, k, v in (strided, dense_bnhd, [t.contiguous() for t in strided]):
        o, lse2 = flash_attn_fwd(q, k, v, True, head_dim ** -0.5, "hopper")
        do = torch.randn_like(o)
        grads = flash_attn_bwd(do, q, k, v, o, lse2, True, head_dim ** -0.5, "hopper")
        for grad, x in zip(grads, (q, k, v)):
            like = torch.empty_like(x)
            assert grad.dtype == x.dtype and grad.shape == x.shape and grad.stride() == like.stride()
        torch.library.opcheck(torch.ops.flashgpt.flash_attn_bwd.default,
                              (do, q, k, v, o, lse2, True, head_dim ** -0.5, "hopper"), test_utils=("test_faketensor",))


@pytest.mark.gpu
@on_hopper
def test_hopper_backward_under_torch_compile():
    # the trainer's path: compiled model, q, k, v as views of one projection, the default schedule
    projected = torch.randn(1, 4096, 3, 2, 64, device="cuda", dtype=BF16, requires_grad=True)

    def attend(x):
        q, k, v = x.permute(2, 0, 3, 1, 4)
        return flash_attention(q, k, v, causal=True, deterministic=False).transpose(1, 2).sum()

    compiled = torch.compile(attend, fullgraph=True)
    compiled(projected).backward()
    grad_compiled = projected.grad.clone()
    projected.grad = None
    attend(projected).backward()
    # the dQ sums run in scheduling order: equal up to float32 reordering, rounded to bf16
    torch.testing.assert_close(grad_compiled, projected.grad, rtol=2e-2, atol=2e-2)


# ----------------------------------------------------------------------------------------------
# The forward, on an sm_90 GPU
# ----------------------------------------------------------------------------------------------
@pytest.fixture(params=[True, False], ids=["strided_tma", "contiguous_copies"])
def forward_strided(request, monkeypatch):
    """HOPPER_FORWARD's configs (STRIDED: 4-D descriptors over the inputs' strides) and the same off."""
    monkeypatch.setattr(launch, "HOPPER_FORWARD",
                        {key: dataclasses.replace(cfg, STRIDED=request.param) for key, cfg in launch.HOPPER_FORWARD.items()})


def check_forward(q, k, v, causal, kernel, window_size=(-1, -1)):
    """launch.forward's O against float64 under the exactness rule, LSE (base 2) against float64's,
    +inf on rows that see no key, O in q's layout."""
    from _attention_checks import assert_within_rule

    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    o, lse2 = launch.forward(q, k, v, causal, d ** -0.5, window_size=window_size, kernel=kernel)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    masks = dict(causal=causal, window_size=window_size)
    assert_within_rule(f"{kernel} forward O", o, attention_reference(q64, k64, v64, **masks),
                       [attention_reference(q, k, v, dtype=None, **masks)], 3.0)
    scores = q64 @ k64.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2) * d ** -0.5
    visible = attention_mask(nq, nk, causal, window_size, device=q.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    lse_ref = torch.logsumexp(scores, -1) / math.log(2)
    seen = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse2.double()[seen], lse_ref[seen], rtol=0, atol=1e-4)
    assert (lse2[~seen] == math.inf).all()
    assert o.stride() == torch.empty_like(q).stride()


@pytest.mark.gpu
@on_hopper
@pytest.mark.usefixtures("forward_strided")
@pytest.mark.parametrize("head_dim,dtype,causal,seqlen_q,seqlen_k,heads", list(_gpu_cases()))
def test_hopper_forward_is_exact(head_dim, dtype, causal, seqlen_q, seqlen_k, heads):
    q, k, v = make_qkv(2, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype, requires_grad=False)
    check_forward(q, k, v, causal, "hopper")


# Sliding windows on the Hopper kernels (flash-attn's convention, masks.py): left 0, 1, 7, 64,
# beyond the keys; right 0, 3, 50, unlimited; Nq ≠ Nk both ways (150 × 70 with right 0: rows
# whose window holds no key); lengths past several tiles of either kernel; GQA 4:2.
HOPPER_WINDOWS = [
    (100, 100, (7, -1), True), (100, 100, (1, 3), False), (100, 100, (0, 0), False), (100, 100, (64, 3), True),
    (100, 100, (300, 3), False), (100, 100, (-1, 3), False), (70, 150, (7, 3), False), (70, 150, (64, 0), True),
    (150, 70, (1, 0), False), (150, 70, (7, 3), True), (700, 1300, (200, 50), False), (1300, 700, (64, 0), True),
    (2100, 2100, (1000, -1), True), (2100, 2100, (129, 129), False), (333, 333, (-1, 0), False),
]


def _window_cases():
    for d, dtype, (nq, nk, window, causal) in itertools.product((64, 128), (BF16, FP16), HOPPER_WINDOWS):
        if dtype == FP16 and nq > 1000:
            continue  # the long ones once, in bf16
        yield pytest.param(d, dtype, nq, nk, window, causal,
                           id=f"d{d}-{str(dtype)[6:]}-q{nq}-k{nk}-w{window[0]}:{window[1]}-{'causal' if causal else 'full'}")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim,dtype,seqlen_q,seqlen_k,window,causal", list(_window_cases()))
def test_hopper_forward_with_a_window_is_exact(head_dim, dtype, seqlen_q, seqlen_k, window, causal):
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, head_dim, dtype, requires_grad=False)
    check_forward(q, k, v, causal, "hopper", window)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim,dtype,seqlen_q,seqlen_k,window,causal", list(_window_cases()))
def test_hopper_backward_with_a_window_is_exact(head_dim, dtype, seqlen_q, seqlen_k, window, causal):
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, head_dim, dtype)
    check_against_reference(q, k, v, causal, schedule="hopper", window_size=window)


@pytest.mark.gpu
@on_hopper
def test_hopper_forward_takes_windows_on_a_persistent_grid(monkeypatch):
    # the table's d=64 config loops over tiles (PERSISTENT): a window's tiles have unequal key ranges
    from kernels.flash_attn import forward_hopper

    assert launch.HOPPER_FORWARD[("d64", "16bit")].PERSISTENT
    monkeypatch.setattr(forward_hopper, "_sm_count", lambda device: 3)
    q, k, v = make_qkv(2, 4, 2, 1500, 1500, 64, BF16, requires_grad=False)
    check_forward(q, k, v, True, "hopper", (300, -1))


@pytest.mark.gpu
@on_hopper
@pytest.mark.usefixtures("forward_strided")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("layout", ["qkv_views", "bnhd", "d_strided"])
def test_hopper_forward_takes_strided_inputs(head_dim, layout):
    check_forward(*strided_qkv(layout, head_dim), True, "hopper")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim,dtype,causal,seqlen_q,seqlen_k,heads",
                         [c for c in _gpu_cases() if c.values[0] == 64])
def test_hopper_forward_with_two_consumer_warpgroups_is_exact_at_d64(monkeypatch, head_dim, dtype, causal, seqlen_q,
                                                                     seqlen_k, heads):
    # the table takes three warpgroups at d=64 (192-row programs); two (d=128's) stay exact there too
    assert launch.HOPPER_FORWARD[("d64", "16bit")].CONSUMERS == 3
    config = launch.HopperForwardConfig(STAGES=2, CONSUMERS=2, CONSUMER_REGS=240, STRIDED=True)
    monkeypatch.setitem(launch.HOPPER_FORWARD, ("d64", "16bit"), config)
    q, k, v = make_qkv(2, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype, requires_grad=False)
    check_forward(q, k, v, causal, "hopper")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("head_dim,dtype,causal,seqlen_q,seqlen_k,heads", list(_gpu_cases()))
def test_persistent_hopper_forward_is_exact(monkeypatch, consumers, head_dim, dtype, causal, seqlen_q, seqlen_k, heads):
    # PERSISTENT: fewer programs than tiles (a small GPU's worth here), each looping over several
    if consumers == 3 and head_dim == 128:
        pytest.skip("192 rows of d=128 accumulators do not fit the register file")
    from kernels.flash_attn import forward_hopper

    regs = 160 if consumers == 3 else 240
    config = launch.HopperForwardConfig(STAGES=2, CONSUMERS=consumers, CONSUMER_REGS=regs, STRIDED=True, PERSISTENT=True)
    monkeypatch.setitem(launch.HOPPER_FORWARD, launch._table_key(head_dim, dtype), config)
    monkeypatch.setattr(forward_hopper, "_sm_count", lambda device: 3)  # many tiles per program
    # causal: heads in L2 groups of 3, the last one smaller (2 batches × 4 or 2 query heads)
    monkeypatch.setattr(forward_hopper, "L2_GROUP_BYTES", 3 * 2 * seqlen_k * head_dim * dtype.itemsize)
    q, k, v = make_qkv(2, heads[0], heads[1], seqlen_q, seqlen_k, head_dim, dtype, requires_grad=False)
    check_forward(q, k, v, causal, "hopper")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim,causal", [(128, True), (128, False)])
def test_tl_forward_stays_exact_where_hopper_is_picked(head_dim, causal):
    # the portable kernel is the reference: forced, it must stay exact on the shapes Hopper now takes
    q, k, v = make_qkv(2, 4, 2, 300, 2100, head_dim, BF16, requires_grad=False)
    check_forward(q, k, v, causal, "tl")


@pytest.mark.gpu
@on_hopper
def test_default_forward_runs_hopper_where_picked(monkeypatch):
    from kernels.flash_attn import forward_hopper

    calls = spy(monkeypatch, forward_hopper, "forward_hopper")
    for head_dim, seqlen, picked in ((64, FWD_MIN_D64, True), (64, FWD_MIN_D64 // 2, False), (128, 256, True)):
        calls.clear()
        q, k, v = make_qkv(1, 2, 2, seqlen, seqlen, head_dim, BF16, requires_grad=False)
        flash_attention(q, k, v, causal=True)
        assert bool(calls) == picked, (head_dim, seqlen)
        calls.clear()
        flash_attention(q, k, v, causal=True, window_size=(64, 0))  # a window: the same choice
        assert bool(calls) == picked, (head_dim, seqlen, "window")
        calls.clear()
        docs = torch.zeros(1, seqlen, dtype=torch.int32, device=q.device)
        docs[:, seqlen // 2:] = 1
        flash_attention(q, k, v, causal=True, document_ids=docs)  # document ids: forward.py
        assert not calls
