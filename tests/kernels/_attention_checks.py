"""Exactness-rule helpers shared by the kernel's test modules (docs/DESIGN.md, "Exactness rule").

The kernel's max abs error against a float64 reference may be at most 2× (output) or 3×
(gradients) that of plain PyTorch attention computed in the input dtype, plus 1e-5.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import pytest
import torch

from kernels.flash_attn import check_inputs, check_masks, launch
from kernels.flash_attn.launch import KernelConfig
from kernels.flash_attn.op import attention_fwd
from kernels.reference import attention_backward_reference, attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Make every torch.empty / empty_like return NaN-filled memory while the test runs."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))


@contextlib.contextmanager
def launch_table_changed(change: Callable[[str, KernelConfig], dict]) -> Iterator[None]:
    """Inside the block, the launchers' table lookups for kernel `name` return the table's config
    with the fields `change(name, config)` gives replaced, so the public function (autograd, custom
    ops) runs under other launch configs. Direct launcher calls take `config=` instead."""
    table = launch.kernel_config

    def changed(kernel: str, *args, **kwargs) -> KernelConfig:
        config = table(kernel, *args, **kwargs)
        return dataclasses.replace(config, **change(kernel, config))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "kernel_config", changed)
        yield


def slow_except(values: list, fast: list, ids: Callable) -> list:
    """Parametrize values, every one not in `fast` marked slow: `-m "not slow"` runs the fast
    ones, a plain run the whole sweep."""
    return [pytest.param(v, id=ids(v), marks=() if v in fast else pytest.mark.slow) for v in values]


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, requires_grad=True):
    def rand(heads, n):
        return torch.randn(batch, heads, n, head_dim, device=DEVICE, dtype=dtype, requires_grad=requires_grad)

    return rand(heads_q, seqlen_q), rand(heads_kv, seqlen_k), rand(heads_kv, seqlen_k)


def leaf_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh leaf with t's values *and* strides. clone() would compact a view with gaps (a slice
    such as x[..., ::2]), so the kernel would never see its strides; the gaps hold NaN here, so a
    kernel that reads one fails the exactness check. t must not overlap itself (no stride 0)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    leaf = torch.full((span,), float("nan"), dtype=t.dtype, device=t.device).as_strided(t.shape, t.stride()).detach()
    with torch.no_grad():
        leaf.copy_(t)
    return leaf.requires_grad_()


def float64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """float64 copies, so the reference's gradients stay float64 too (on leaves of the input dtype
    autograd would round them to it, and a plain-dtype standard that rounds the same way would
    then look error-free)."""
    return [t.double() for t in tensors]


def run_fwd_bwd(fn, q, k, v, do, **kw):
    """Output and (dq, dk, dv) of fn on fresh leaf copies of q, k, v (same strides)."""
    leaves = [leaf_copy(t) for t in (q, k, v)]
    out = fn(*leaves, **kw)
    out.backward(do.to(out.dtype))
    return out.detach(), [t.grad for t in leaves]


def assert_within_rule(name: str, got: torch.Tensor, ref: torch.Tensor, standard: torch.Tensor | list[torch.Tensor],
                       factor: float, allowance: torch.Tensor | None = None) -> None:
    """got vs the float64 ref, allowed `factor`× the error of the standards (plain PyTorch in the
    input dtype: the largest of their max errors) plus 1e-5, plus `allowance` (broadcast to got)
    where a caller derives a conditioning bound the standards' luck can undercut.

    The standard's error is a max over elements, so on a handful of elements it can be near 0 by
    luck (found by the property tests: one query, two keys, head_dim 1). No implementation in a
    dtype can promise better than one unit in its last place, so at each element the standard
    error counts as at least that element's ulp; on tensors of any size this changes nothing."""
    nan = got.isnan()
    assert not nan.any(), f"{name}: {int(nan.sum())} NaN elements (unwritten output?) first at {nan.nonzero()[0].tolist()}"
    err = (got.double() - ref).abs()
    standards = standard if isinstance(standard, list) else [standard]
    standard_err = max((s.double() - ref).abs().max().item() for s in standards)
    ulp = torch.finfo(got.dtype).eps * torch.exp2(torch.floor(torch.log2(ref.abs())))  # 0 where ref is 0
    bound = factor * ulp.clamp(min=standard_err) + 1e-5
    if allowance is not None:
        bound = bound + allowance
    i = (err - bound).argmax()
    where = [int(j) for j in torch.unravel_index(i, err.shape)]
    assert err.flatten()[i] <= bound.flatten()[i], (
        f"{name}: abs error {err.flatten()[i]:.3g} at {where} exceeds {factor}× the {got.dtype} standard "
        f"error {standard_err:.3g} (or one ulp there, {ulp.flatten()[i]:.3g}) + 1e-5"
        f"{'' if allowance is None else ' + the allowance there'} (bound {bound.flatten()[i]:.3g}; got "
        f"{got.flatten()[i].item():.6g}, ref {ref.flatten()[i].item():.6g})"
    )


def flash_scheduled(q, k, v, causal=False, softmax_scale=None, schedule="two_pass", window_size=(-1, -1), document_ids=None):
    """flash_attention with its backward schedule forced (one of launch.SCHEDULES): the public
    function derives it from `deterministic` and the device, the tests must reach each one anywhere."""
    check_inputs(q, k, v, causal, softmax_scale)
    check_masks(q, k, window_size, document_ids)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return attention_fwd(q, k, v, causal, scale, schedule, *window_size, document_ids)[0]


def check_against_reference(q, k, v, causal, softmax_scale=None, schedule="two_pass", window_size=(-1, -1), document_ids=None):
    """Run kernel, float64 reference and the plain-dtype standard; apply the exactness rule.
    `schedule` picks the kernel's backward ("fused": the single pass with atomic dQ adds);
    window_size and document_ids are passed to all three."""
    do = torch.randn(q.shape, device=q.device, dtype=torch.float64)
    kw = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, document_ids=document_ids)
    out, grads = run_fwd_bwd(flash_scheduled, q, k, v, do, schedule=schedule, **kw)
    ref, ref_grads = run_fwd_bwd(attention_reference, *float64(q, k, v), do, **kw)
    std, std_grads = run_fwd_bwd(attention_reference, q, k, v, do, dtype=None, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    # the gradients' standard: the larger error of autograd's and of the kernel's own formulas
    # (delta = rowsum(dO ∘ O)) in the input dtype; they differ where a row sees one key only
    formula_grads = attention_backward_reference(q.detach(), k.detach(), v.detach(), do, **kw)
    assert_within_rule("O", out, ref, std, 2.0)
    for name, g, r, s, f in zip(("dQ", "dK", "dV"), grads, ref_grads, std_grads, formula_grads):
        assert g.shape == r.shape, f"{name} shape {tuple(g.shape)} != {tuple(r.shape)}"
        assert_within_rule(name, g, r, [s, f], 3.0)
