"""kernels/flash_attention.py against a float64 reference, with the exactness rule of DESIGN.md:
the kernel's max abs error may be at most 2× (output) or 3× (gradients) that of plain PyTorch
attention computed in the input dtype, plus 1e-5.

Runs through the Triton interpreter on a CPU (importing `kernels` switches it on) and compiled
on a GPU. Fresh random inputs every run; every output buffer is poisoned with NaN first, so an
element the kernel forgets to write fails the test. The single-pass backward
(deterministic=False) is held to the same rule on a subset of the shapes.
"""
from __future__ import annotations

import contextlib
import math
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kernels import attention_flops, flash_attention
from kernels.flash_attention import KERNELS, _tma_ok, forced_config, kernel_config
from _attention_checks import (  # noqa: F401  poisoned_outputs is a fixture
    DEVICE, DTYPES, check_against_reference, make_qkv, poisoned_outputs, run_fwd_bwd,
)

# (batch, seqlen_q, seqlen_k, head_dim, heads_q, heads_kv): lengths 1, 17, 64, 257 and unequal
# pairs both ways, head dims 16/40/64/80/128, MHA / GQA 4:2 / MQA 4:1. 257 = 4·64 + 1 leaves a
# one-row block. Sizes are kept small because the CPU interpreter pays per program × key block.
SHAPES = [
    (2, 1, 1, 16, 2, 2),
    (2, 17, 17, 40, 4, 2),
    (1, 64, 64, 64, 4, 1),
    (1, 257, 257, 80, 1, 1),
    (1, 17, 100, 128, 2, 2),
    (2, 100, 17, 64, 4, 2),
    (1, 257, 130, 16, 2, 1),
    (2, 1, 70, 40, 2, 1),
]


# The fused backward's own risks are dQ tiles added by several key-block programs (seqlen_k > 64),
# by the query heads of one GQA group, and rows that see no key (causal 257 × 130: rows 0..126).
FUSED_SHAPES = [SHAPES[0], SHAPES[1], SHAPES[4], SHAPES[5], SHAPES[6]]
shape_ids = lambda s: "b{}-q{}-k{}-d{}-h{}:{}".format(*s)  # noqa: E731
dtype_ids = lambda d: str(d).removeprefix("torch.")  # noqa: E731


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_ids)
def test_matches_float64_reference(shape, causal, dtype, poisoned_outputs):
    batch, seqlen_q, seqlen_k, head_dim, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype)
    check_against_reference(q, k, v, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=shape_ids)
def test_fused_backward_matches_float64_reference(shape, causal, dtype, poisoned_outputs):
    batch, seqlen_q, seqlen_k, head_dim, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype)
    check_against_reference(q, k, v, causal, deterministic=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_head_dim_256(dtype, poisoned_outputs):
    q, k, v = make_qkv(1, 2, 1, 70, 90, 256, dtype)
    check_against_reference(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_strided_inputs_without_copies(dtype, poisoned_outputs):
    # the model's layout: one (B, N, 3, H, D) projection, viewed as (B, H, N, D) without a copy
    batch, seqlen, heads, head_dim = 1, 75, 2, 32
    qkv = torch.randn(batch, seqlen, 3, heads, head_dim, device=DEVICE, dtype=dtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    check_against_reference(q, k, v, causal=True)
    # a head_dim-strided view (every other channel) and a transposed seqlen/head_dim storage
    wide = torch.randn(batch, heads, seqlen, 2 * head_dim, device=DEVICE, dtype=dtype)
    k_t = torch.randn(batch, heads, head_dim, seqlen, device=DEVICE, dtype=dtype).transpose(2, 3)
    check_against_reference(wide[..., ::2], k_t, wide[..., 1::2], causal=False, softmax_scale=0.3)


def test_output_keeps_query_memory_layout():
    q = torch.randn(2, 40, 4, 16, device=DEVICE).transpose(1, 2)  # (B, H, N, D) view of (B, N, H, D)
    k, v = torch.randn(2, 4, 40, 16, device=DEVICE), torch.randn(2, 4, 40, 16, device=DEVICE)
    out = flash_attention(q, k, v)
    assert out.stride() == q.stride()
    assert out.transpose(1, 2).is_contiguous()  # so the model's reshape back to (B, N, C) is free


def test_backward_is_deterministic():
    q, k, v = make_qkv(1, 2, 1, 130, 130, 32, torch.bfloat16)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    _, first = run_fwd_bwd(flash_attention, q, k, v, do, causal=True)  # the default is deterministic
    _, second = run_fwd_bwd(flash_attention, q, k, v, do, causal=True, deterministic=True)
    for name, a, b in zip(("dQ", "dK", "dV"), first, second):
        assert torch.equal(a, b), f"{name} differs between two identical backward passes"


@pytest.mark.parametrize(
    "dtype, deterministic", [*((d, True) for d in DTYPES), (torch.bfloat16, False)],
    ids=[*map(dtype_ids, DTYPES), "bfloat16-fused"],
)
def test_rows_that_see_no_key_give_zeros_and_zero_gradients(dtype, deterministic, poisoned_outputs):
    # causal with seqlen_q > seqlen_k: query i sees keys j <= i - 50, so rows 0..49 see nothing
    q, k, v = make_qkv(1, 2, 2, 120, 70, 32, dtype)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    out, (dq, dk, dv) = run_fwd_bwd(flash_attention, q, k, v, do, causal=True, deterministic=deterministic)
    assert not any(t.isnan().any() for t in (out, dq, dk, dv))
    assert torch.equal(out[:, :, :50], torch.zeros_like(out[:, :, :50]))
    assert torch.equal(dq[:, :, :50], torch.zeros_like(dq[:, :, :50]))
    check_against_reference(q, k, v, causal=True, deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-pass", "fused"])
def test_flop_counter_sees_forward_and_recomputing_backward(deterministic):
    # both schedules report the algorithm's 5 backward matmuls (the two-pass one executes 7)
    batch, heads, seqlen, head_dim = 1, 2, 96, 32
    for causal in (False, True):
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.float32)
        with FlopCounterMode(display=False) as counter:
            flash_attention(q, k, v, causal=causal, deterministic=deterministic).sum().backward()
        counts = counter.get_flop_counts()["Global"]
        fwd = counts[torch.ops.flashgpt.flash_attn_fwd]
        bwd = counts[torch.ops.flashgpt.flash_attn_bwd]
        pairs = seqlen * seqlen if not causal else seqlen * (seqlen + 1) // 2
        assert fwd == 4 * batch * heads * pairs * head_dim
        assert bwd == 10 * batch * heads * pairs * head_dim  # 5 matmuls: S = QKᵀ is recomputed
        assert bwd / fwd == 2.5
        assert fwd == attention_flops(batch, heads, seqlen, seqlen, head_dim, causal, "fwd")


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-pass", "fused"])
def test_torch_compile_fullgraph_forward_and_backward(deterministic):
    q, k, v = make_qkv(1, 2, 1, 40, 40, 16, torch.float32)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)

    def block(q, k, v):
        return flash_attention(q * 2.0, k, v, causal=True, deterministic=deterministic) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got, got_grads = run_fwd_bwd(compiled, q, k, v, do)
    want, want_grads = run_fwd_bwd(block, q, k, v, do)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the fused backward's dQ sums its atomic adds in a scheduling-dependent order on a GPU
    exact = 0 if deterministic or DEVICE == "cpu" else 1e-6
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=exact, atol=exact)


def test_softmax_scale_defaults_to_inverse_sqrt_head_dim():
    q, k, v = make_qkv(1, 1, 1, 20, 20, 16, torch.float32, requires_grad=False)
    assert torch.equal(flash_attention(q, k, v), flash_attention(q, k, v, softmax_scale=1 / math.sqrt(16)))


def test_deterministic_flag_picks_the_backward(monkeypatch):
    fa = sys.modules["kernels.flash_attention"]  # the package's name `flash_attention` is the function
    calls = []
    for name in ("_bwd_dkdv", "_bwd_dq", "_bwd_fused"):
        launcher = getattr(fa, name)
        monkeypatch.setattr(fa, name, lambda *a, _name=name, _launch=launcher: calls.append(_name) or _launch(*a))
    q, k, v = make_qkv(1, 2, 1, 20, 20, 16, torch.float32)
    for deterministic, expected in ((True, ["_bwd_dkdv", "_bwd_dq"]), (False, ["_bwd_fused"])):
        calls.clear()
        flash_attention(q, k, v, deterministic=deterministic).sum().backward()
        assert calls == expected


def test_reversed_program_order_gives_the_same_result():
    # REVERSE only renumbers the programs: outputs and dK, dV are bitwise the same; the fused
    # backward's dQ adds its key blocks' shares in another order, equal up to float32 rounding
    assert kernel_config("fwd", 32, torch.float32, True).REVERSE and kernel_config("bwd_dq", 128, torch.float32, True).REVERSE
    assert not kernel_config("bwd_dq", 64, torch.bfloat16, True).REVERSE  # measured slower reversed at d=64
    assert not any(kernel_config(name, 32, torch.float32, False).REVERSE for name in KERNELS)
    q, k, v = make_qkv(1, 2, 1, 150, 140, 32, torch.float32)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    runs = {}
    for flipped in (False, True):
        with contextlib.ExitStack() as stack:
            for name in KERNELS:
                if flipped:
                    stack.enter_context(forced_config(name, REVERSE=not kernel_config(name, 32, torch.float32, True).REVERSE))
            runs[flipped] = [run_fwd_bwd(flash_attention, q, k, v, do, causal=True, deterministic=d) for d in (True, False)]
    (out, grads), (fused_out, fused_grads) = runs[False]
    (out_r, grads_r), (fused_out_r, fused_grads_r) = runs[True]
    assert torch.equal(out, out_r) and torch.equal(fused_out, fused_out_r)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_r))
    assert all(torch.equal(a, b) for a, b in zip(fused_grads[1:], fused_grads_r[1:]))
    torch.testing.assert_close(fused_grads[0], fused_grads_r[0], rtol=1e-5, atol=1e-6)


def test_forced_block_sizes_give_the_same_result():
    q, k, v = make_qkv(1, 2, 2, 100, 100, 32, torch.float32, requires_grad=False)
    default = flash_attention(q, k, v, causal=True)
    with forced_config("fwd", BLOCK_M=32, BLOCK_N=16):
        assert kernel_config("fwd", 32, torch.float32, True).BLOCK_N == 16
        small = flash_attention(q, k, v, causal=True)
    assert kernel_config("fwd", 32, torch.float32, True).BLOCK_N != 16 or DEVICE == "cuda"
    torch.testing.assert_close(small, default, rtol=1e-5, atol=1e-5)


# the copy engine exists from Hopper on; the interpreter emulates it
HAS_TMA = DEVICE != "cuda" or torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_tma_and_pointer_loads_agree(dtype, layout):
    # TMA changes only how tiles reach the kernel: rows past seqlen and columns past head_dim (40
    # is padded to 64) must come in as the zeros the masked loads give, so every kernel's output is
    # bitwise the same either way; with GQA, ragged lengths and the causal mask's diagonal blocks.
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = 1, 4, 2, 100, 130, 40
    if layout == "bhnd":
        q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype)
    else:  # the model's (B, N, H, D) storage seen as (B, H, N, D): row stride H·D
        q, k, v = (torch.randn(batch, n, h, head_dim, device=DEVICE, dtype=dtype).transpose(1, 2).requires_grad_()
                   for n, h in ((seqlen_q, heads_q), (seqlen_k, heads_kv), (seqlen_k, heads_kv)))
    assert _tma_ok(q, k, v) == HAS_TMA  # else both runs take the pointer loads
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    runs = {}
    for tma in (False, True):
        with contextlib.ExitStack() as stack:
            for name in KERNELS:
                stack.enter_context(forced_config(name, TMA=tma))
            runs[tma] = [run_fwd_bwd(flash_attention, q, k, v, do, causal=True, deterministic=d) for d in (True, False)]
    for (out, grads), (out_tma, grads_tma) in zip(runs[False], runs[True]):
        assert torch.equal(out, out_tma)
        assert all(torch.equal(a, b) for a, b in zip(grads[1:], grads_tma[1:]))  # dK, dV
    assert torch.equal(runs[False][0][1][0], runs[True][0][1][0])  # the two-pass dQ (the fused one sums atomically)


def test_tma_only_where_the_copy_engine_can_read():
    x = torch.randn(1, 2, 50, 64, device=DEVICE, dtype=torch.bfloat16)
    assert _tma_ok(x) == _tma_ok(x.transpose(1, 2).contiguous().transpose(1, 2)) == HAS_TMA
    assert not _tma_ok(torch.randn(1, 2, 50, 33, device=DEVICE, dtype=torch.bfloat16))  # 66-byte rows
    assert not _tma_ok(x[..., ::2])  # head_dim not contiguous
    assert not _tma_ok(x[:, :, :1].expand(1, 2, 50, 64))  # every row the same memory (stride 0)
    assert not _tma_ok(torch.randn(1, 2, 50, 65, device=DEVICE, dtype=torch.bfloat16)[..., 1:])  # 2-byte offset base
    # the table asks for TMA where it measured faster; such inputs still work: the launch falls back
    assert kernel_config("bwd_dq", 64, torch.bfloat16, False).TMA
    q, k, v = make_qkv(1, 2, 1, 40, 40, 33, torch.bfloat16)
    with forced_config("fwd", TMA=True), forced_config("bwd_dkdv", TMA=True):
        check_against_reference(q, k, v, causal=True)


def _ok():
    return [torch.randn(1, 2, 8, 16, device=DEVICE) for _ in range(3)]


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda q, k, v: (q[0], k, v), ValueError, "q must be 4-D"),
        (lambda q, k, v: (q, k.half(), v), TypeError, "share one dtype"),
        (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "supports float16, bfloat16 and float32"),
        (lambda q, k, v: (q.int(), k, v), TypeError, "q has dtype torch.int32"),
        (lambda q, k, v: (q, torch.randn(2, 2, 8, 16, device=DEVICE), v), ValueError, "k and v must have the same shape"),
        (lambda q, k, v: (q, k[:1].repeat(2, 1, 1, 1), v[:1].repeat(2, 1, 1, 1)), ValueError, "batch sizes differ"),
        (lambda q, k, v: (q, k[..., :8], v[..., :8]), ValueError, "head_dim differs"),
        (lambda q, k, v: (q[:, :1].repeat(1, 3, 1, 1), k, v), ValueError, "not a multiple"),
        (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "q is empty"),
        (lambda q, k, v: (q[..., :0], k[..., :0], v[..., :0]), ValueError, "q is empty"),
        (lambda q, k, v: tuple(torch.randn(1, 2, 8, 300, device=DEVICE) for _ in range(3)), ValueError, "up to 256"),
        (lambda q, k, v: ("q", k, v), TypeError, "q must be a torch.Tensor"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, error, message):
    with pytest.raises(error, match=message):
        flash_attention(*change(*_ok()))


def test_bad_arguments_raise_clear_errors():
    q, k, v = _ok()
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attention(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="softmax_scale must be a finite number"):
        flash_attention(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flash_attention(q, k, v, deterministic=None)
    with pytest.raises(ValueError, match="kernel must be one of 'fwd', 'bwd_dkdv', 'bwd_dq', 'bwd_fused'"):
        with forced_config("bwd"):
            pass


def test_mixed_devices_raise():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="one device"):
        flash_attention(q, k.to("meta"), v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="long sequences are GPU-only (the interpreter is slow)")
@pytest.mark.parametrize("seqlen", [1024, 4095, 8192])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["two-pass", "fused"])  # fused: real concurrent atomics
def test_long_sequences_bf16_on_gpu(seqlen, causal, deterministic):
    q, k, v = make_qkv(1, 4, 2, seqlen, seqlen, 64, torch.bfloat16)
    check_against_reference(q, k, v, causal, deterministic=deterministic)


def test_meta_tensors_trace_shapes_without_a_kernel(monkeypatch):
    """The trainer counts FLOPs on a meta-device model: that must work on a GPU machine too,
    where the interpreter is off (simulated here), and give the forward's and backward's shapes."""
    monkeypatch.setattr(sys.modules["kernels.flash_attention"], "interpreting", lambda: False)  # the package's name is the function
    q = torch.randn(2, 4, 33, 16, device="meta", requires_grad=True)
    k = torch.randn(2, 2, 40, 16, device="meta", requires_grad=True)
    v = torch.randn(2, 2, 40, 16, device="meta", requires_grad=True)
    for deterministic in (True, False):
        out = flash_attention(q, k, v, causal=True, deterministic=deterministic)
        assert out.device.type == "meta" and out.shape == q.shape
        q.grad = k.grad = v.grad = None
        out.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    with pytest.raises(ValueError, match="needs a CUDA device"):
        flash_attention(*(torch.randn(1, 1, 4, 16) for _ in range(3)))  # real CPU tensors still refused
