"""kernels/flash_attn against a float64 reference, with the exactness rule of docs/DESIGN.md:
the kernel's max abs error may be at most 2× (output) or 3× (gradients) that of plain PyTorch
attention computed in the input dtype, plus 1e-5.

Runs through the Triton interpreter on a CPU (importing `kernels` switches it on) and compiled
on a GPU. Fresh random inputs every run; every output buffer is poisoned with NaN first, so an
element the kernel forgets to write fails the test. The single-pass backward
(schedule "fused") is held to the same rule on a subset of the shapes.
"""
from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from _attention_checks import (
    DEVICE,
    DTYPES,
    assert_within_rule,
    check_against_reference,
    flash_scheduled,
    launch_table_changed,
    make_qkv,
    poisoned_outputs,  # noqa: F401  (a fixture: pytest finds it by this name)
    run_fwd_bwd,
    slow_except,
)
from torch.utils.flop_counter import FlopCounterMode

import kernels.flash_attn as fa
from kernels import attention_flops, flash_attention, flash_attn_backward, flash_attn_forward
from kernels.flash_attn import launch, op
from kernels.flash_attn.launch import KERNELS, kernel_config, tma_ok
from kernels.reference import causal_mask

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
poisoned = pytest.mark.usefixtures("poisoned_outputs")  # outputs start as NaN: unwritten elements fail
shape_ids = lambda s: "b{}-q{}-k{}-d{}-h{}:{}".format(*s)  # noqa: E731
dtype_ids = lambda d: str(d).removeprefix("torch.")  # noqa: E731
causal_ids = lambda c: "causal" if c else "full"  # noqa: E731
# `-m "not slow"` runs one shape of each sweep, causal, in every dtype (fused: bfloat16 only)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids)
@pytest.mark.parametrize("causal", slow_except([False, True], [True], causal_ids))
@pytest.mark.parametrize("shape", slow_except(SHAPES, [SHAPES[1]], shape_ids))
@poisoned
def test_matches_float64_reference(shape, causal, dtype):
    batch, seqlen_q, seqlen_k, head_dim, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype)
    check_against_reference(q, k, v, causal)


@pytest.mark.parametrize("dtype", slow_except(DTYPES, [torch.bfloat16], dtype_ids))
@pytest.mark.parametrize("causal", slow_except([False, True], [True], causal_ids))
@pytest.mark.parametrize("shape", slow_except(FUSED_SHAPES, [FUSED_SHAPES[1]], shape_ids))
@poisoned
def test_fused_backward_matches_float64_reference(shape, causal, dtype):
    batch, seqlen_q, seqlen_k, head_dim, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype)
    check_against_reference(q, k, v, causal, schedule="fused")


@pytest.mark.slow  # the forward at 256 is also in test_largest_head_dim_is_accepted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_ids)
@poisoned
def test_head_dim_256(dtype):
    q, k, v = make_qkv(1, 2, 1, 70, 90, 256, dtype)
    check_against_reference(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", slow_except(DTYPES, [torch.bfloat16], dtype_ids))
@poisoned
def test_strided_inputs_without_copies(dtype):
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


def test_default_backward_does_not_depend_on_program_order():
    # What deterministic (the default) promises: dQ, dK, dV bitwise the same however the programs
    # are scheduled. Two identical runs check that on a GPU; running every kernel's programs in
    # reverse order checks it on both (the interpreter runs programs in grid order). The control
    # shows the check can fail: the same reversal changes the fused backward's dQ, whose key blocks
    # (seqlen_k 300: several per dQ tile) add their float32 shares in the order they run.
    q, k, v = make_qkv(1, 2, 1, 64, 300, 16, torch.float32)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)

    def grads(schedule="two_pass"):
        return run_fwd_bwd(flash_scheduled, q, k, v, do, schedule=schedule)[1]

    first, second, fused_dq = grads(), grads(), grads("fused")[0]
    with launch_table_changed(lambda name, config: dict(REVERSE=not config.REVERSE)):
        reordered, fused_dq_reordered = grads(), grads("fused")[0]
    for name, a, b, c in zip(("dQ", "dK", "dV"), first, second, reordered):
        assert torch.equal(a, b), f"{name} differs between two identical backward passes"
        assert torch.equal(a, c), f"{name} changes when the programs run in reverse order"
    assert not torch.equal(fused_dq, fused_dq_reordered), "control: the fused dQ should change with the order of its adds"


@pytest.mark.parametrize(
    "dtype, schedule",
    [*(pytest.param(d, "two_pass", id=dtype_ids(d), marks=() if d == torch.bfloat16 else pytest.mark.slow) for d in DTYPES),
     pytest.param(torch.bfloat16, "fused", id="bfloat16-fused")],
)
@poisoned
def test_rows_that_see_no_key_give_zeros_and_zero_gradients(dtype, schedule):
    # causal with seqlen_q > seqlen_k: query i sees keys j <= i - 50, so rows 0..49 see nothing
    q, k, v = make_qkv(1, 2, 2, 120, 70, 32, dtype)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    out, (dq, dk, dv) = run_fwd_bwd(flash_scheduled, q, k, v, do, causal=True, schedule=schedule)
    assert not any(t.isnan().any() for t in (out, dq, dk, dv))
    assert torch.equal(out[:, :, :50], torch.zeros_like(out[:, :, :50]))
    assert torch.equal(dq[:, :, :50], torch.zeros_like(dq[:, :, :50]))
    check_against_reference(q, k, v, causal=True, schedule=schedule)


@pytest.mark.parametrize("schedule", ["two_pass", "fused"])
def test_flop_counter_sees_forward_and_recomputing_backward(schedule):
    # both schedules report the algorithm's 5 backward matmuls (the two-pass one executes 7)
    batch, heads, seqlen, head_dim = 1, 2, 96, 32
    for causal in (False, True):
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.float32)
        with FlopCounterMode(display=False) as counter:
            flash_scheduled(q, k, v, causal=causal, schedule=schedule).sum().backward()
        counts = counter.get_flop_counts()["Global"]
        fwd = counts[torch.ops.flashgpt.flash_attn_fwd]
        bwd = counts[torch.ops.flashgpt.flash_attn_bwd]
        pairs = seqlen * seqlen if not causal else seqlen * (seqlen + 1) // 2
        assert fwd == 4 * batch * heads * pairs * head_dim
        assert bwd == 10 * batch * heads * pairs * head_dim  # 5 matmuls: S = QKᵀ is recomputed
        assert bwd / fwd == 2.5
        assert fwd == attention_flops(batch, heads, seqlen, seqlen, head_dim, causal, "fwd")


def test_eager_calls_skip_the_custom_op_layer_and_match_it(monkeypatch):
    # plain eager code runs the launchers under an autograd.Function (the custom op's Python layer
    # cost more host time than the launches, perf-notes v6), bitwise the custom op's result;
    # a dispatch mode such as FlopCounterMode still goes through the custom ops
    q, k, v = make_qkv(1, 2, 1, 70, 70, 32, torch.bfloat16)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    by_op = run_fwd_bwd(lambda *qkv: op.flash_attn_fwd(*qkv, True, 0.2)[0], q, k, v, do)
    calls = []
    for name in ("flash_attn_fwd", "flash_attn_bwd"):
        monkeypatch.setattr(op, name, lambda *a, _op=getattr(op, name), _name=name: calls.append(_name) or _op(*a))

    def public(*qkv):
        return flash_attention(*qkv, causal=True, softmax_scale=0.2, deterministic=True)

    eager = run_fwd_bwd(public, q, k, v, do)
    assert calls == []
    assert all(torch.equal(a, b) for a, b in zip([by_op[0], *by_op[1]], [eager[0], *eager[1]]))
    with FlopCounterMode(display=False):
        run_fwd_bwd(public, q, k, v, do)
    assert calls == ["flash_attn_fwd", "flash_attn_bwd"]


def test_eager_path_names_its_ops_for_the_profiler():
    # training/profiling.py finds attention by the custom ops' names: the eager path records them too
    q, k, v = make_qkv(1, 1, 1, 40, 40, 16, torch.float32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        flash_attention(q, k, v, causal=True).sum().backward()
    assert {"flashgpt::flash_attn_fwd", "flashgpt::flash_attn_bwd"} <= {e.name for e in prof.events()}


def test_float32_dq_is_the_sum_the_cast_would_round():
    # dq_float32: the fused schedule's float32 dQ sum itself, contiguous; the default casts that same
    # sum into q's dtype and layout. Schedules that compute dQ in q's dtype refuse it.
    qkv = torch.randn(1, 70, 3, 2, 32, device=DEVICE, dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)  # the model's views
    q, k, v = qkv
    do = torch.randn_like(q)
    o, lse2 = launch.forward(q, k, v, True, 0.2)
    dq, dk, dv = launch.backward(do, q, k, v, o, lse2, True, 0.2, "fused")
    dq32, dk32, dv32 = launch.backward(do, q, k, v, o, lse2, True, 0.2, "fused", dq_float32=True)
    assert dq32.dtype == torch.float32 and dq32.is_contiguous() and dq.stride() == torch.empty_like(q).stride()
    assert torch.equal(dq32.to(q.dtype), dq) and torch.equal(dk32, dk) and torch.equal(dv32, dv)
    with pytest.raises(ValueError, match="dq_float32=True needs a schedule that sums dQ in float32"):
        launch.backward(do, q, k, v, o, lse2, True, 0.2, "two_pass", dq_float32=True)


def test_custom_op_path_takes_the_float32_dq_sum_and_casts_it_in_the_graph(monkeypatch):
    # through the custom ops (as under torch.compile or a dispatch mode), a float32-summing
    # schedule hands dQ over uncast and the autograd formula casts it: the cast is then a graph op
    # Inductor can fuse into dQ's consumer; the gradients are those of the eager path
    q, k, v = make_qkv(1, 2, 1, 70, 70, 32, torch.bfloat16)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    seen = []
    backward = launch.backward

    def spy(*args, **kwargs):
        call = inspect.signature(backward).bind(*args, **kwargs)
        call.apply_defaults()
        seen.append((call.arguments["schedule"], call.arguments["dq_float32"]))
        return backward(*args, **kwargs)

    monkeypatch.setattr(launch, "backward", spy)

    def public(*qkv):
        return flash_attention(*qkv, causal=True, deterministic=False)

    eager = run_fwd_bwd(public, q, k, v, do)
    assert seen == [("fastest", False)]  # the eager path: launch.backward resolves and casts
    seen.clear()
    with FlopCounterMode(display=False):
        by_op = run_fwd_bwd(public, q, k, v, do)
    fastest = launch.fastest_schedule(q, k)
    assert seen == [(fastest, fastest in launch.FLOAT32_DQ_SCHEDULES)]
    assert by_op[1][0].dtype == q.dtype
    assert all(torch.equal(a, b) for a, b in zip([by_op[0], *by_op[1]], [eager[0], *eager[1]]))


@pytest.mark.parametrize("deterministic", slow_except([True, False, None], [None], lambda d: {True: "two-pass", False: "fastest", None: "follow-torch"}[d]))
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


@pytest.mark.parametrize("fastest", ["fused", "two_pass"])
def test_deterministic_flag_picks_the_backward(monkeypatch, fastest):
    # True: the two passes; False: launch.fastest_schedule's pick; None: torch's deterministic switch
    calls = []
    for name in ("backward_dkdv", "backward_dq", "backward_fused"):
        launcher = getattr(launch, name)
        monkeypatch.setattr(launch, name, lambda *a, _name=name, _launch=launcher, **kw: calls.append(_name) or _launch(*a, **kw))
    monkeypatch.setattr(launch, "fastest_schedule", lambda q, k=None, masked=False: fastest)
    two_pass = ["backward_dq", "backward_dkdv"]  # the dQ pass writes the delta the dK/dV pass reads
    fast = ["backward_fused"] if fastest == "fused" else two_pass
    q, k, v = make_qkv(1, 2, 1, 20, 20, 16, torch.float32)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for torch_deterministic in (False, True):
            torch.use_deterministic_algorithms(torch_deterministic)
            for deterministic, expected in ((True, two_pass), (False, fast), (None, two_pass if torch_deterministic else fast)):
                calls.clear()
                flash_attention(q, k, v, deterministic=deterministic).sum().backward()
                assert calls == expected, (torch_deterministic, deterministic)
    finally:
        torch.use_deterministic_algorithms(before)


def test_fastest_schedule_per_device(monkeypatch):
    q = torch.zeros(1, 1, 4, 64)
    monkeypatch.setattr(launch, "interpreting", lambda: True)
    assert launch.fastest_schedule(q) == "fused"  # the interpreter: half the programs of the two passes
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    assert launch.fastest_schedule(q) == "two_pass"  # a CPU tensor without the interpreter: no atomics race to win
    if torch.cuda.is_available():  # a GPU, 4 keys (below HOPPER_MIN_SEQLEN): whatever FUSED_FASTER measured
        on_gpu = q.cuda().bfloat16()
        fused = launch.FUSED_FASTER.get(("d64", "16bit"), False) and torch.cuda.get_device_capability()[0] >= 9
        assert launch.fastest_schedule(on_gpu) == ("fused" if fused else "two_pass")
    with pytest.raises(ValueError, match="schedule must be one of 'two_pass', 'fused', 'hopper', 'fastest'"):
        launch.backward(q, q, q, q, q, q[..., 0], False, 1.0, schedule="single")


@pytest.mark.slow  # the not-slow loop reverses the program order in test_default_backward_does_not_depend_on_program_order
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
        with launch_table_changed(lambda name, config: dict(REVERSE=config.REVERSE != flipped)):
            runs[flipped] = [run_fwd_bwd(flash_scheduled, q, k, v, do, causal=True, schedule=s) for s in ("two_pass", "fused")]
    (out, grads), (fused_out, fused_grads) = runs[False]
    (out_r, grads_r), (fused_out_r, fused_grads_r) = runs[True]
    assert torch.equal(out, out_r) and torch.equal(fused_out, fused_out_r)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_r))
    assert all(torch.equal(a, b) for a, b in zip(fused_grads[1:], fused_grads_r[1:]))
    torch.testing.assert_close(fused_grads[0], fused_grads_r[0], rtol=1e-5, atol=1e-6)


def test_a_config_passed_to_the_launcher_changes_only_the_tiles():
    q, k, v = make_qkv(1, 2, 2, 100, 100, 32, torch.float32, requires_grad=False)
    default = flash_attention(q, k, v, causal=True)
    table = kernel_config("fwd", 32, torch.float32, True)
    small = dataclasses.replace(table, BLOCK_M=32, BLOCK_N=16)
    assert small != table
    out, _ = launch.forward(q, k, v, True, 1 / math.sqrt(32), config=small)
    assert kernel_config("fwd", 32, torch.float32, True) == table  # nothing global changed
    torch.testing.assert_close(out, default, rtol=1e-5, atol=1e-5)


def test_launch_table_names_its_kernels():
    assert {key[0] for key in launch.LAUNCH_TABLE} == set(KERNELS)
    with pytest.raises(ValueError, match="kernel must be one of 'fwd', 'bwd_dkdv', 'bwd_dq', 'bwd_fused'"):
        kernel_config("bwd", 64, torch.float16, False)


# the copy engine exists from Hopper on; the interpreter emulates it
HAS_TMA = DEVICE != "cuda" or torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.slow
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
    assert tma_ok(q, k, v) == HAS_TMA  # else both runs take the pointer loads
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    runs = {}
    for tma in (False, True):
        with launch_table_changed(lambda name, config: dict(TMA=tma)):
            runs[tma] = [run_fwd_bwd(flash_attention, q, k, v, do, causal=True, deterministic=d) for d in (True, False)]
    for (out, grads), (out_tma, grads_tma) in zip(runs[False], runs[True]):
        assert torch.equal(out, out_tma)
        assert all(torch.equal(a, b) for a, b in zip(grads[1:], grads_tma[1:]))  # dK, dV
    assert torch.equal(runs[False][0][1][0], runs[True][0][1][0])  # the two-pass dQ (the fused one sums atomically)


def test_tma_only_where_the_copy_engine_can_read():
    x = torch.randn(1, 2, 50, 64, device=DEVICE, dtype=torch.bfloat16)
    assert tma_ok(x) == tma_ok(x.transpose(1, 2).contiguous().transpose(1, 2)) == HAS_TMA
    assert not tma_ok(torch.randn(1, 2, 50, 33, device=DEVICE, dtype=torch.bfloat16))  # 66-byte rows
    assert not tma_ok(x[..., ::2])  # head_dim not contiguous
    assert not tma_ok(x[:, :, :1].expand(1, 2, 50, 64))  # every row the same memory (stride 0)
    assert not tma_ok(torch.randn(1, 2, 50, 65, device=DEVICE, dtype=torch.bfloat16)[..., 1:])  # 2-byte offset base
    # the table asks for TMA where it measured faster; such inputs still work: the launch falls back
    assert kernel_config("bwd_dq", 64, torch.bfloat16, False).TMA
    q, k, v = make_qkv(1, 2, 1, 40, 40, 33, torch.bfloat16)
    with launch_table_changed(lambda name, config: dict(TMA=True) if name in ("fwd", "bwd_dkdv") else {}):
        check_against_reference(q, k, v, causal=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="long sequences are GPU-only (the interpreter is slow)")
@pytest.mark.parametrize("seqlen", [1024, 4095, 8192])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", ["two_pass", "fused"])  # fused: real concurrent atomics (TMA reduce-add on Hopper)
def test_long_sequences_bf16_on_gpu(seqlen, causal, schedule):
    q, k, v = make_qkv(1, 4, 2, seqlen, seqlen, 64, torch.bfloat16)
    check_against_reference(q, k, v, causal, schedule=schedule)


def test_meta_tensors_trace_shapes_without_a_kernel(monkeypatch):
    """The trainer counts FLOPs on a meta-device model: that must work on a GPU machine too,
    where the interpreter is off (simulated here), and give the forward's and backward's shapes."""
    monkeypatch.setattr(fa, "interpreting", lambda: False)  # what check_inputs asks
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


# ----------------------------------------------------------------------------------------------
# flash_attn_forward / flash_attn_backward: the passes as separate calls (context parallelism)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_lse_is_the_logsumexp_of_the_scaled_scores(dtype, causal):
    # causal 90 queries × 70 keys: rows 0..19 see no key and carry +inf (zero gradients)
    q, k, v = make_qkv(1, 2, 1, 90, 70, 40, dtype, requires_grad=False)
    scale = 0.3
    out, lse = flash_attn_forward(q, k, v, causal=causal, softmax_scale=scale)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3] and not out.requires_grad
    assert torch.equal(out, flash_attention(q, k, v, causal=causal, softmax_scale=scale))
    visible = causal_mask(90, 70, DEVICE) if causal else torch.ones(90, 70, dtype=torch.bool, device=DEVICE)

    def logsumexp(precision):  # natural log of Σ_j e^{scale·s_j} over the visible keys
        kr = k.to(precision).repeat_interleave(2, dim=1)
        scores = (q.to(precision) @ kr.transpose(-2, -1)) * scale
        return scores.masked_fill(~visible, float("-inf")).logsumexp(-1)

    seen = visible.any(-1).expand_as(lse)
    assert (lse[~seen] == float("inf")).all()
    # the kernel keeps scores in float32 whatever the input dtype: float32 math is its standard
    assert_within_rule("LSE", lse[seen], logsumexp(torch.float64)[seen], logsumexp(torch.float32)[seen], 2.0)


def test_lse_merges_partial_results_over_key_blocks():
    # the log-sum-exp identity ring attention relies on: attention over keys [0, 30) and [30, 70)
    # merged by their lse is attention over all 70 keys
    q, k, v = make_qkv(2, 4, 2, 50, 70, 32, torch.float32, requires_grad=False)
    out, lse = flash_attn_forward(q, k, v)
    out_1, lse_1 = flash_attn_forward(q, k[:, :, :30], v[:, :, :30])
    out_2, lse_2 = flash_attn_forward(q, k[:, :, 30:], v[:, :, 30:])
    merged_lse = torch.logaddexp(lse_1, lse_2)
    merged = (lse_1 - merged_lse).exp()[..., None] * out_1 + (lse_2 - merged_lse).exp()[..., None] * out_2
    torch.testing.assert_close(merged_lse, lse)
    torch.testing.assert_close(merged, out)


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-pass", "fused"])
def test_backward_equals_autograd_of_flash_attention(deterministic):
    q, k, v = make_qkv(1, 2, 1, 50, 70, 40, torch.bfloat16, requires_grad=False)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    want_out, want = run_fwd_bwd(flash_attention, q, k, v, do, causal=True, deterministic=deterministic)
    out, lse = flash_attn_forward(q, k, v, causal=True)
    got = flash_attn_backward(do.to(q.dtype), q, k, v, out, lse, causal=True, deterministic=deterministic)
    assert torch.equal(out, want_out)
    # not bitwise: the public lse is in natural log and goes back to the kernels' base 2 (lse·log2 e),
    # which can move P by a float32 ulp and flip the bfloat16 rounding of P or dS inside the kernel
    # (the fused dQ's atomic adds on a GPU likewise). Such a flip moves a gradient element by a bf16
    # ulp of the terms it sums, not of itself, so the bound is one bf16 ulp of the gradient's largest
    # element (300 random cases measured at most 0.41 of it; assert_close's elementwise default, 2
    # ulps of each element, failed 7 % of runs on near-zero elements)
    for name, a, b in zip(("dQ", "dK", "dV"), got, want):
        bound = torch.finfo(b.dtype).eps * b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=0, atol=bound, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(lse=lambda lse: lse.double()), "lse must be torch.float32 of shape"),
        (dict(lse=lambda lse: lse[:, :1]), "lse must be torch.float32 of shape"),
        (dict(out=lambda out: out.float()), "out must be torch.bfloat16"),
        (dict(dout=lambda dout: dout[..., :8]), "dout must be torch.bfloat16 of shape"),
        (dict(dout=lambda dout: dout.tolist()), "dout must be a torch.Tensor"),
    ],
    ids=["lse-float64", "lse-one-head", "out-float32", "dout-shape", "dout-list"],
)
def test_backward_rejects_mismatched_saved_tensors(change, message):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.bfloat16, requires_grad=False)
    saved = dict(zip(("out", "lse"), flash_attn_forward(q, k, v)), dout=torch.randn_like(q))
    saved = {name: change.get(name, lambda t: t)(t) for name, t in saved.items()}
    with pytest.raises((ValueError, TypeError), match=message):
        flash_attn_backward(saved["dout"], q, k, v, saved["out"], saved["lse"])
