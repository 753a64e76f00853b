"""kernels/flash_attn under adversarial input: random problems (hypothesis), extreme
values, NaN/Inf inputs and bad arguments.

The yardstick is the exactness rule of docs/DESIGN.md (tests/kernels/_attention_checks.py). Property tests run
a fixed, derandomized "ci" profile by default (5 problems per dtype, about half a minute on 2 CPU
cores through the Triton interpreter); the larger "gpu" profile is opt-in on a CUDA machine:

    HYPOTHESIS_PROFILE=gpu python -m pytest -q tests/kernels/test_flash_attn_hardening.py

The profiles are applied to this module's tests only (not loaded globally), so other modules'
hypothesis settings do not depend on which test file pytest imported first.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from _attention_checks import (
    DEVICE,
    DTYPES,
    assert_within_rule,
    check_against_reference,
    float64,
    make_qkv,
    poisoned_outputs,  # noqa: F401  (a fixture: pytest finds it by this name)
    run_fwd_bwd,
    slow_except,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kernels.flash_attn as fa
from kernels import flash_attention
from kernels.flash_attn import launch
from kernels.flash_attn.launch import kernel_config
from kernels.reference import attention_reference, causal_mask

poisoned = pytest.mark.usefixtures("poisoned_outputs")  # outputs start as NaN: unwritten elements fail

# ----------------------------------------------------------------------------------------------
# Property-based: random shapes, dtypes, masks and memory layouts
# ----------------------------------------------------------------------------------------------

# database=None: no example database in the repository; print_blob: a failure prints how to replay
# it. ci reports a failing example as drawn (its seed replays it) instead of shrinking it, which
# takes minutes on 2 cores; the gpu profile shrinks.
settings.register_profile(
    "ci", max_examples=5, derandomize=True, deadline=None, database=None, print_blob=True,
    phases=(Phase.explicit, Phase.generate),
)
# gpu: 50 random problems per dtype, new ones every run; a head_dim not seen before compiles the four
# kernels first (seconds each, then cached on disk by Triton), so a run can take minutes
settings.register_profile("gpu", max_examples=50, deadline=None, database=None, print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
# The interpreter's cost is about batch·heads_q × query tiles × key tiles (64×64): the ci profile
# caps that product, so a long sequence comes with a short one and few heads (300 × 60, one head;
# 60 × 60, up to six heads); the gpu profile draws every size up to 300 × 300 with 16 heads.
MAX_TILES = {"ci": 6}.get(PROFILE, 10**9)
LAYOUTS = ("contiguous", "seq_major", "dim_major", "sliced")


def with_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values stored another way: the (B, N, H, D) projection layout viewed as (B, H, N, D), a
    (B, H, D, N) storage (head_dim strided), or a window of a larger buffer (offset rows, every
    other channel) whose unused elements are NaN, so a kernel reading outside its view fails."""
    b, h, n, d = t.shape
    if layout == "contiguous":
        return t.contiguous()
    if layout == "seq_major":
        out = t.new_empty(b, n, h, d).transpose(1, 2)
    elif layout == "dim_major":
        out = t.new_empty(b, h, d, n).transpose(2, 3)
    else:
        out = torch.full((b, h + 1, n + 3, 2 * d), float("nan"), dtype=t.dtype, device=t.device)[:, 1:, 2 : n + 2, ::2]
    return out.copy_(t)


@st.composite
def attention_problems(draw: st.DrawFn) -> dict:
    causal = draw(st.booleans())
    batch, heads_kv = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    group = draw(st.integers(1, max(1, min(4, MAX_TILES // (batch * heads_kv)))))  # 1: MHA, else GQA/MQA
    tiles = max(1, MAX_TILES // (batch * heads_kv * group))  # query × key tiles left per head
    seqlen_q = draw(st.integers(1, min(300, 64 * tiles)))
    # one key without a mask makes dK exactly 0, which plain PyTorch returns exactly by
    # construction, leaving the rule only its 1e-5 floor, below the kernel's float32 rounding of
    # dP − delta summed over seqlen_q rows: test_single_key_gives_its_value_and_zero_dk bounds that
    seqlen_k = draw(st.integers(1 if causal else 2, min(300, 64 * max(1, tiles // math.ceil(seqlen_q / 64)))))
    head_dim = draw(st.integers(1, 256))
    # scores of ordinary size (|s| up to ~10): at larger ones float32 gradients drift past the rule
    # on the interpreter (forward and backward sum S = QKᵀ in different BLAS orders, and P = e^{S − LSE}
    # does not cancel that as softmax's max subtraction does); large scores are tested below
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda x: x / math.sqrt(head_dim))))
    return dict(
        batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        head_dim=head_dim, causal=causal, softmax_scale=scale,
        layouts=draw(st.tuples(*[st.sampled_from(LAYOUTS)] * 3)), seed=draw(st.integers(0, 2**31 - 1)),
        schedule=draw(st.sampled_from(["two_pass", "fused"])),  # fused: the single-pass backward with atomic dQ adds
    )


@pytest.mark.slow
@poisoned
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))  # each its own examples
@settings(settings.get_profile(PROFILE), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=attention_problems())
def test_random_problems_match_float64_reference(dtype, problem):
    p = problem
    # the seed is part of the example, so a failure replays with the same tensors (and dO)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if DEVICE == "cuda" else []):
        torch.manual_seed(p["seed"])
        shape = [p[key] for key in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")]
        qkv = make_qkv(*shape, dtype, requires_grad=False)
        q, k, v = (with_layout(t, layout) for t, layout in zip(qkv, p["layouts"]))
        check_against_reference(q, k, v, p["causal"], p["softmax_scale"], p["schedule"])


def test_layouts_reach_the_kernel_with_their_strides(monkeypatch):
    # the property test is only as good as its layouts: make sure the kernel sees them uncopied
    seen = []
    forward = launch.forward

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.stride(), k.stride()))
        return forward(q, k, v, *args, **kwargs)

    monkeypatch.setattr(launch, "forward", spy)
    q, k, v = make_qkv(1, 2, 2, 9, 9, 8, torch.float32, requires_grad=False)
    for layout in LAYOUTS:
        q2, k2 = with_layout(q, layout), with_layout(k, layout)
        run_fwd_bwd(flash_attention, q2, k2, v, torch.randn(q.shape, dtype=torch.float64, device=DEVICE))
        assert seen[-1] == (q2.stride(), k2.stride()), f"{layout}: kernel saw {seen[-1]}, not {(q2.stride(), k2.stride())}"
    assert len({s for s, _ in seen}) == len(LAYOUTS)


# ----------------------------------------------------------------------------------------------
# Extreme values: outputs by the exactness rule, gradients finite
# ----------------------------------------------------------------------------------------------


def score_rounding_allowance(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ref: torch.Tensor,
                             causal: bool) -> torch.Tensor:
    """What rounding the scores alone can move O by, per row: a score s held in float32 is off by
    up to |s|·2⁻²⁴ per rounding, each weight e^{s − m} by that much relative, so O_i by up to that
    times max_j |v_j − O_i| ≤ max |v| + |O_i|. Two roundings' worth (the product's, the scale's):
    2 · 2⁻²⁴ · max_j |s_ij| · (max |v| + |O_i|), ~1-2 % of |O| at these scores. Plain PyTorch's
    float32 error, a max over elements at one draw, sometimes undercut ours by 5× here (about one
    run in ten failed the rule alone); over 150 draws our error stayed within a third of one
    rounding's worth, and an O(1) error (a lost rescale, a wrong weight) stays far outside it."""
    q64, k64 = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = (q64 @ k64.transpose(-1, -2)).abs() * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), 0.0)
    spread = v.double().abs().amax() + ref.abs().amax(-1, keepdim=True)
    return 2 * 2.0 ** -24 * s.amax(-1, keepdim=True) * spread


def check_extreme(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, list]:
    """Exactness rule on the output (plus the scores' rounding allowance), finiteness of every
    gradient; returns output and gradients.

    Gradients are not held to the rule here: the backward rebuilds P = e^{S − LSE} from a float32
    LSE and a recomputed S, both rounded at the scale of |S|, so at |S| ~ 1e3–1e4 every P carries
    a relative error of ~|S|·2⁻²⁴ (as in FlashAttention-2), while plain PyTorch's softmax subtracts
    the row max exactly. Measured: float32 dV off by ~3e-3 relative at ×100 inputs."""
    do = torch.randn(q.shape, device=q.device, dtype=torch.float64)
    out, grads = run_fwd_bwd(flash_attention, q, k, v, do, causal=causal)
    ref, _ = run_fwd_bwd(attention_reference, *float64(q, k, v), do, causal=causal)
    with torch.no_grad():
        std = attention_reference(q, k, v, causal, dtype=None)
        if not std.isfinite().all():
            # float16 q·kᵀ overflowed (65504) in plain PyTorch; fused kernels (SDPA, cuDNN, this one)
            # keep scores in float32, so their standard is float32 math rounded to float16
            std = attention_reference(q, k, v, causal, dtype=torch.float32).to(q.dtype)
    assert out.isfinite().all(), f"O: {int((~out.isfinite()).sum())} non-finite elements"
    assert_within_rule("O", out, ref, std, 2.0, score_rounding_allowance(q, k, v, ref, causal))
    for name, g in zip(("dQ", "dK", "dV"), grads):
        bad = ~g.isfinite()
        assert not bad.any(), f"{name}: {int(bad.sum())} non-finite elements, first at {bad.nonzero()[0].tolist()}"
    return out, grads


# `-m "not slow"` runs the float32 cases of this section and the NaN ones of the next
dtypes = pytest.mark.parametrize("dtype", slow_except(DTYPES, [torch.float32], lambda d: str(d).removeprefix("torch.")))
causal_or_not = pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
# numpy, running the interpreter, warns about the overflow and NaN arithmetic provoked on purpose
# (e^{huge} of scores that are masked afterwards, NaN - NaN); a compiled kernel raises no flags
numpy_flags = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@numpy_flags
@dtypes
@causal_or_not
@poisoned
def test_scores_far_beyond_float16_range(dtype, causal):
    # q·kᵀ ~ 1e4·√64 (float16 stops at 65504): softmax is nearly one-hot, e^{s − m} underflows to 0
    # for almost every key, and α = e^{m_old − m_new} does too whenever the max jumps. Causal with
    # seqlen_q > seqlen_k adds 20 rows that see no key.
    q, k, v = make_qkv(1, 2, 1, 90, 70, 64, dtype, requires_grad=False)
    out, (dq, _, _) = check_extreme(q * 100, k * 100, v, causal)
    if causal:
        assert not out[:, :, :20].any() and not dq[:, :, :20].any()  # exact zeros


@numpy_flags
@dtypes
@poisoned
def test_huge_negative_and_positive_logits_in_one_row(dtype):
    # channel 0 carries scores from −3e4 to +3e4 (×scale ≈ ±5300) in every row: even rows see them
    # rising across the key blocks (the running max grows every block), odd rows falling (later
    # blocks add e^{−10⁴} = 0). Other channels are ordinary, so ties are broken as usual.
    q, k, v = make_qkv(1, 1, 1, 130, 130, 32, dtype, requires_grad=False)
    q[..., 0::2, 0], q[..., 1::2, 0] = 200.0, -200.0
    k[..., 0] = torch.linspace(-150.0, 150.0, k.shape[2], device=DEVICE)
    check_extreme(q, k, v, causal=False)


@numpy_flags
@dtypes
@poisoned
def test_all_equal_scores(dtype):
    # identical keys: every visible score in a row is the same, so P is uniform over the causal
    # prefix and O the running mean of V
    q, k, v = make_qkv(1, 1, 1, 130, 130, 32, dtype, requires_grad=False)
    k = k[:, :, :1].expand_as(k).contiguous()
    out, _ = check_extreme(q, k, v, causal=True)
    visible = causal_mask(130, 130, DEVICE)
    mean_v = (visible.double() / visible.sum(-1, keepdim=True)) @ v.double()
    assert (out.double() - mean_v).abs().max() < 2e-2  # loose: the rule above already bounds it tightly


@numpy_flags
@dtypes
@pytest.mark.parametrize("seqlen_q", [1, 130])
@causal_or_not
@poisoned
def test_single_key_gives_its_value_and_zero_dk(dtype, seqlen_q, causal):
    # one key: softmax over it is the constant 1 for every row that sees it, so O = v and dK = 0.
    # Causal with seqlen_q = 130 leaves 129 rows with no key at all (zeros).
    q, k, v = make_qkv(1, 2, 1, seqlen_q, 1, 40, dtype, requires_grad=False)
    do = torch.randn(q.shape, device=DEVICE, dtype=torch.float64)
    out, (dq, dk, dv) = run_fwd_bwd(flash_attention, q, k, v, do, causal=causal)
    ref, (ref_dq, _, ref_dv) = run_fwd_bwd(attention_reference, *float64(q, k, v), do, causal=causal)
    std, (std_dq, _, std_dv) = run_fwd_bwd(attention_reference, q, k, v, do, causal=causal, dtype=None)
    assert_within_rule("O", out, ref, std, 2.0)
    assert_within_rule("dQ", dq, ref_dq, std_dq, 3.0)
    assert_within_rule("dV", dv, ref_dv, std_dv, 3.0)
    # dK = scale·Σ_i dS_i q_i with dS_i = dP_i − delta_i = dO_i·v − dO_i·o_i, which cancels
    # exactly only in exact arithmetic: bound each float32 dot product's rounding by
    # head_dim·2⁻²⁴·Σ_d |dO_id·v_d| (plus the rounding of o to the input dtype, which is exact
    # here since o = v) and sum it over the rows.
    do_in = do.to(dtype).double()
    dot_err = q.shape[-1] * 2.0**-24 * (do_in.abs() @ v.double().abs().transpose(-2, -1))  # (B, H, Nq, 1)
    bound = (dot_err * q.double().abs() / math.sqrt(q.shape[-1])).sum((1, 2), keepdim=True) + 1e-5
    worst = dk.double().abs().max()
    assert dk.isfinite().all() and (dk.double().abs() <= bound).all(), f"dK {worst:.3g} above its rounding bound {bound.max():.3g}"
    if causal and seqlen_q > 1:
        assert torch.equal(out[:, :, :-1], torch.zeros_like(out[:, :, :-1]))


# ----------------------------------------------------------------------------------------------
# NaN and Inf inputs: non-finite exactly where the inputs reach, correct everywhere else
# ----------------------------------------------------------------------------------------------

# each value with another dtype: the kernel works in float32 after its loads, so the dtype only
# has to carry the value there (bfloat16 on the interpreter goes through a bit-level rounding)
NONFINITE = pytest.mark.parametrize(
    "value, dtype",
    [pytest.param(float("nan"), torch.float16, id="nan-float16"),
     pytest.param(float("inf"), torch.bfloat16, id="inf-bfloat16", marks=pytest.mark.slow),
     pytest.param(float("-inf"), torch.float32, id="-inf-float32", marks=pytest.mark.slow)],
)
BATCH, HEADS_Q, HEADS_KV = 2, 1, 1  # the poison goes into batch 0; batch 1 must not notice
# (output buffers are not NaN-poisoned in this section, so an unwritten row cannot pass for a NaN)


def bad_rows(t: torch.Tensor) -> torch.Tensor:
    """(B, H, N) bool: rows holding a NaN or ±Inf."""
    return (~t.isfinite()).any(-1)


def assert_rows(name: str, got: torch.Tensor, ref: torch.Tensor, std: torch.Tensor, factor: float,
                must_be_bad: torch.Tensor, may_be_bad: torch.Tensor | None = None) -> None:
    """Rows in must_be_bad are non-finite; rows outside must_be_bad | may_be_bad are finite and
    within the exactness rule against ref and std restricted to those rows."""
    bad = bad_rows(got)
    missing = must_be_bad & ~bad
    assert not missing.any(), (
        f"{name}: {int(missing.sum())} rows should be non-finite but are finite (silently cleaned), first {missing.nonzero()[0].tolist()}")
    clean = ~must_be_bad if may_be_bad is None else ~(must_be_bad | may_be_bad)
    leaked = bad & clean
    assert not leaked.any(), (
        f"{name}: non-finite values leaked into {int(leaked.sum())} rows the bad input cannot reach, first {leaked.nonzero()[0].tolist()}")
    assert_within_rule(f"{name} (unaffected rows)", got[clean], ref[clean], std[clean], factor)


def poisoned_runs(tensor: str, index: tuple, value: float, causal: bool, dtype: torch.dtype, seqlen: int = 96) -> dict:
    """Output and gradients of the kernel on inputs where one element of q, k or v is `value`,
    and of the float64 reference and plain-dtype standard on those inputs and on the clean ones."""
    clean = make_qkv(BATCH, HEADS_Q, HEADS_KV, seqlen, seqlen, 16, dtype, requires_grad=False)
    poisoned = [t.clone() for t in clean]
    poisoned["qkv".index(tensor)][index] = value
    do = torch.randn(clean[0].shape, device=DEVICE, dtype=torch.float64)
    runs = dict(kernel=(flash_attention, poisoned, {}), ref=(attention_reference, float64(*poisoned), {}),
                std=(attention_reference, poisoned, dict(dtype=None)), clean_ref=(attention_reference, float64(*clean), {}),
                clean_std=(attention_reference, clean, dict(dtype=None)))
    return {name: run_fwd_bwd(fn, *qkv, do, causal=causal, **kw) for name, (fn, qkv, kw) in runs.items()}


def rows_of(like: torch.Tensor, b: int | None = None, h: int | slice | None = None, n: int | slice | None = None) -> torch.Tensor:
    """(B, H, N) bool mask over the rows of `like`, True at [b, h, n] (None: all)."""
    mask = torch.zeros(like.shape[:3], dtype=torch.bool, device=like.device)
    mask[tuple(slice(None) if i is None else i for i in (b, h, n))] = True
    return mask


@numpy_flags
@NONFINITE
@causal_or_not
def test_nonfinite_query_reaches_only_its_row(value, dtype, causal):
    # q[0, 0, 40] poisoned: O and dQ of that row turn non-finite (NaN scores, or ±inf scores whose
    # e^{inf − inf} is NaN), and so do dK, dV of the keys it sees, as in exact arithmetic. Every
    # other row of O and dQ, and the other batch everywhere, stays exact.
    r = poisoned_runs("q", (0, 0, 40, 3), value, causal, dtype)
    (out, grads), (ref, ref_grads), (std, std_grads) = r["kernel"], r["ref"], r["std"]
    row = rows_of(out, 0, 0, 40)
    assert_rows("O", out, ref, std, 2.0, row)
    assert_rows("dQ", grads[0], ref_grads[0], std_grads[0], 3.0, row)
    seen_keys = rows_of(grads[1], 0, 0, slice(0, 41) if causal else None)  # query 40 sees keys 0..40 (causal)
    for name, g, rg, sg in zip(("dK", "dV"), grads[1:], ref_grads[1:], std_grads[1:]):
        # keys it cannot see may still pick up 0·NaN inside a shared tile; batch 1 may not
        assert_rows(name, g, rg, sg, 3.0, seen_keys, may_be_bad=rows_of(g, 0))


@numpy_flags
@NONFINITE
@causal_or_not
def test_nonfinite_key_reaches_only_rows_that_see_it(value, dtype, causal):
    # k[0, 0, 40] poisoned: score column 40 is NaN or ±inf. Rows that see key 40 turn non-finite
    # unless their score is −inf (weight 0, as in softmax); rows that cannot see it (causal:
    # rows < 40) are masked *before* any product and stay exact. The float64 reference decides
    # which rows are non-finite, and the kernel must agree row for row.
    r = poisoned_runs("k", (0, 0, 40, 3), value, causal, dtype)
    (out, grads), (ref, ref_grads), (std, std_grads) = r["kernel"], r["ref"], r["std"]
    assert torch.equal(bad_rows(out), bad_rows(ref)), (
        f"non-finite rows: kernel {bad_rows(out).nonzero().tolist()[:4]}…, float64 {bad_rows(ref).nonzero().tolist()[:4]}…")
    assert_rows("O", out, ref, std, 2.0, bad_rows(ref))
    if value != value:  # NaN: exactly the rows that see key 40
        assert torch.equal(bad_rows(out), rows_of(out, 0, None, slice(40, None) if causal else None))
    for name, g, rg, sg in zip(("dQ", "dK", "dV"), grads, ref_grads, std_grads):  # batch 1 untouched
        assert_rows(name, g, rg, sg, 3.0, torch.zeros_like(rows_of(g)), may_be_bad=rows_of(g, 0))


@numpy_flags
@NONFINITE
def test_nonfinite_value_reaches_rows_that_see_it_and_at_most_their_tile(value, dtype):
    # v[0, 0, j] poisoned, causal. Rows that see key j turn non-finite. A row that cannot see j
    # gives it weight 0, but if its query tile loads key j's block, the tile's P·V product
    # multiplies that 0 by NaN/Inf, which is NaN in IEEE arithmetic (as in every tiled kernel;
    # PyTorch's own attention turns *every* row non-finite here). Rows of tiles that never load
    # key j stay finite and exact: checked against the clean inputs, which they do not depend on.
    cfg = kernel_config("fwd", 16, dtype, True)
    seqlen = cfg.BLOCK_M + 16  # the first query tile never reaches the last keys
    j = seqlen - 8
    r = poisoned_runs("v", (0, 0, j, 3), value, True, dtype, seqlen=seqlen)
    (out, grads), (ref, ref_grads), (std, std_grads) = r["kernel"], r["clean_ref"], r["clean_std"]
    rows = torch.arange(seqlen, device=DEVICE)
    hi = ((rows // cfg.BLOCK_M + 1) * cfg.BLOCK_M).clamp(max=seqlen)  # a row's tile visits keys [0, hi) ...
    tile_reaches_j = (hi + cfg.BLOCK_N - 1) // cfg.BLOCK_N * cfg.BLOCK_N > j  # ... loaded in whole BLOCK_N blocks
    assert not tile_reaches_j[: cfg.BLOCK_M].any()  # the first tile is checked for real
    assert_rows("O", out, ref, std, 2.0, rows_of(out, 0, None, slice(j, None)), may_be_bad=rows_of(out, 0) & tile_reaches_j)
    for name, g, rg, sg in zip(("dQ", "dK", "dV"), grads, ref_grads, std_grads):  # batch 1 untouched
        assert_rows(name, g, rg, sg, 3.0, torch.zeros_like(rows_of(g)), may_be_bad=rows_of(g, 0))


@numpy_flags
@pytest.mark.parametrize("seqlen_k", [10, 70], ids=["one-masked-block", "full-then-masked-block"])
def test_row_whose_every_score_is_minus_inf_is_nan_not_zeros(seqlen_k):
    # q[0, 0, 1, 0] = −inf against keys whose channel 0 is positive: every score of row 1 is −inf,
    # so softmax is 0/0 = NaN there, as PyTorch says. A row that merely sees no key (causal,
    # seqlen_q > seqlen_k) is the only kind that returns zeros.
    q, k, v = make_qkv(1, 1, 1, 4, seqlen_k, 16, torch.float32, requires_grad=False)
    k[..., 0] = k[..., 0].abs() + 0.1
    q[0, 0, 1, 0] = float("-inf")
    out = flash_attention(q, k, v)
    ref = attention_reference(q, k, v)
    assert bad_rows(ref)[0, 0].tolist() == [False, True, False, False]
    assert torch.equal(bad_rows(out), bad_rows(ref)), f"row 1 of the output is {out[0, 0, 1, :4].tolist()}…, expected NaN"


# ----------------------------------------------------------------------------------------------
# Bad input: a clear error before anything is launched
# ----------------------------------------------------------------------------------------------


def _qkv(batch=1, heads_q=2, heads_kv=2, seqlen_q=8, seqlen_k=8, head_dim=16, dtype=torch.float32):
    return make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, requires_grad=False)


def _bad(change=lambda q, k, v: (q, k, v), **shape):
    """A bad-input case: inputs of _qkv(**shape), then `change` applied to them."""
    return lambda: change(*_qkv(**shape))


BAD_INPUTS = {  # id: (make inputs, flash_attention keyword arguments, error, message)
    "q-3d": (_bad(lambda q, k, v: (q[0], k, v)), {}, ValueError, "q must be 4-D"),
    "k-3d": (_bad(lambda q, k, v: (q, k[0], v)), {}, ValueError, "k must be 4-D"),
    "v-5d": (_bad(lambda q, k, v: (q, k, v[None])), {}, ValueError, "v must be 4-D"),
    "q-str": (_bad(lambda q, k, v: ("q", k, v)), {}, TypeError, "q must be a torch.Tensor"),
    "k-list": (_bad(lambda q, k, v: (q, k.tolist(), v)), {}, TypeError, "k must be a torch.Tensor"),
    "float64": (_bad(dtype=torch.float64), {}, TypeError, "supports float16, bfloat16 and float32"),
    "q-int32": (_bad(lambda q, k, v: (q.int(), k, v)), {}, TypeError, "q has dtype torch.int32"),
    "k-float16": (_bad(lambda q, k, v: (q, k.half(), v)), {}, TypeError, "share one dtype"),
    "v-bfloat16": (_bad(lambda q, k, v: (q, k, v.bfloat16())), {}, TypeError, "share one dtype"),
    "v-meta": (_bad(lambda q, k, v: (q, k, v.to("meta"))), {}, ValueError, "one device"),
    "q-meta": (_bad(lambda q, k, v: (q.to("meta"), k, v)), {}, ValueError, "one device"),
    "seqlen_q-0": (_bad(seqlen_q=0), {}, ValueError, "q is empty"),
    "seqlen_k-0": (_bad(seqlen_k=0), {}, ValueError, "k is empty"),
    "batch-0": (_bad(batch=0), {}, ValueError, "q is empty"),
    "head_dim-0": (_bad(head_dim=0), {}, ValueError, "q is empty"),
    "heads_kv-0": (_bad(heads_kv=0), {}, ValueError, "k is empty"),  # not a ZeroDivisionError from heads_q % 0
    "head_dim-257": (_bad(head_dim=257), {}, ValueError, "up to 256"),
    "k-v-shapes": (_bad(lambda q, k, v: (q, torch.randn(2, 2, 8, 16, device=DEVICE), v)), {}, ValueError, "k and v must have the same shape"),
    "batch-differs": (_bad(lambda q, k, v: (q, k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1))), {}, ValueError, "batch sizes differ"),
    "head_dim-differs": (_bad(lambda q, k, v: (q, k[..., :8], v[..., :8])), {}, ValueError, "head_dim differs"),
    "heads_q-3-of-2": (_bad(heads_q=3), {}, ValueError, "not a multiple"),
    "heads_q-below-heads_kv": (_bad(heads_q=1, heads_kv=2), {}, ValueError, "not a multiple"),
    "causal-str": (_bad(), dict(causal="yes"), TypeError, "causal must be a bool"),
    "causal-int": (_bad(), dict(causal=1), TypeError, "causal must be a bool"),
    "deterministic-string": (_bad(), dict(deterministic="yes"), TypeError, "deterministic must be None, True or False"),
    "scale-nan": (_bad(), dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be a finite number"),
    "scale-inf": (_bad(), dict(softmax_scale=float("inf")), ValueError, "softmax_scale must be a finite number"),
    "scale-str": (_bad(), dict(softmax_scale="0.1"), ValueError, "softmax_scale must be a finite number"),
}


@pytest.mark.parametrize("make, kwargs, error, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_inputs_fail_before_any_launch(make, kwargs, error, message, monkeypatch):
    def no_launch(*args):
        raise AssertionError("a kernel was launched before the input was rejected")

    monkeypatch.setattr(launch, "forward", no_launch)
    with pytest.raises(error, match=message):
        flash_attention(*make(), **kwargs)


def test_largest_head_dim_is_accepted():
    # the other side of head_dim-257 (forward only: test_flash_attention checks 256 in full)
    q, k, v = _qkv(seqlen_q=3, seqlen_k=5, head_dim=256)
    assert flash_attention(q, k, v).isfinite().all()


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU tensors without the Triton interpreter")
def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(fa, "interpreting", lambda: False)  # what check_inputs asks (read once at import)
    with pytest.raises(ValueError, match="needs a CUDA device, or TRITON_INTERPRET=1"):
        flash_attention(*_qkv())
