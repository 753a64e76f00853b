"""model/attention.py: the three attend() implementations, the name -> implementation switch, naive's memory."""

import math

import pytest
import torch
import yaml
from conftest import CONFIGS

from model.attention import ATTENTION, SDPA_BACKENDS, get_attention, naive_attention, naive_attention_bytes, sdpa_attention


def reference(q, k, v, causal):
    """float64 softmax(QKᵀ/√d)V with the bottom-right causal mask, independent of the code under test."""
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        i = torch.arange(n_q)[:, None]
        j = torch.arange(n_k)[None, :]
        s = s.masked_fill(j > i + n_k - n_q, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(37, 37), (5, 37)])
@pytest.mark.parametrize("impl", [naive_attention, sdpa_attention])
def test_torch_implementations_match_float64(impl, causal, n_q, n_k):
    q = torch.randn(2, 3, n_q, 16)
    k, v = torch.randn(2, 2, 3, n_k, 16).unbind(0)
    err = (impl(q, k, v, causal=causal).double() - reference(q, k, v, causal)).abs().max().item()
    assert err < 1e-5, f"{impl.__name__} causal={causal} ({n_q}x{n_k}): max abs error {err:.2e}"


def test_sdpa_pinned_math_backend_matches_auto():
    q, k, v = torch.randn(3, 1, 2, 20, 8).unbind(0)
    math_attend = get_attention("sdpa", backend="math")
    torch.testing.assert_close(math_attend(q, k, v, causal=True), get_attention("sdpa")(q, k, v, causal=True))


def test_switch_names_mirror_the_attention_config_group():
    names = {yaml.safe_load(p.read_text())["name"] for p in (CONFIGS / "attention").glob("*.yaml")}
    assert names == set(ATTENTION) == {"naive", "sdpa", "flash"}
    sdpa_backend = yaml.safe_load((CONFIGS / "attention" / "sdpa.yaml").read_text())["backend"]
    assert sdpa_backend == "auto"


@pytest.mark.parametrize("deterministic", [True, False, "auto"])
def test_flash_goes_through_the_kernel(deterministic):
    attend = get_attention("flash", deterministic=deterministic)
    q, k, v = (torch.randn(1, 2, 24, 16, requires_grad=True) for _ in range(3))
    out = attend(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), reference(q, k, v, True), atol=1e-5, rtol=0)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(reference(q, k, v, True).sum(), (q, k, v))
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name,options,message",
    [
        ("flashy", {}, "attention.name='flashy' is unknown; choose one of naive, sdpa, flash"),
        ("sdpa", {"backend": "fast"}, "attention.backend='fast' is not one of auto, " + ", ".join(SDPA_BACKENDS)),
        ("naive", {"backend": "math"}, "attention=naive does not accept options ['backend']"),
        ("flash", {"deterministic": "no"}, "attention.deterministic must be auto, true or false (got 'no')"),
    ],
)
def test_bad_choices_fail_loudly(name, options, message):
    with pytest.raises(ValueError) as err:
        get_attention(name, **options)
    assert message in str(err.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_naive_attention_bytes_match_what_autograd_keeps(dtype):
    b, h, n = 2, 3, 40
    q, k, v = (torch.randn(b, h, n, 8, requires_grad=True) for _ in range(3))
    kept = {}

    def pack(t):
        if t.dim() == 4 and t.shape[-2:] == (n, n):  # the N×N tensors saved for the backward
            kept[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            naive_attention(q, k, v, causal=True)
    one, all_layers = naive_attention_bytes(b, h, n, 5, dtype, "cpu")
    assert one == b * h * n * n * torch.finfo(dtype).bits // 8
    assert all_layers == 5 * sum(kept.values())
    # CUDA autocast saves fp32 P for softmax's backward and bf16 P for P·V's: GPT-2 medium at 8K.
    assert naive_attention_bytes(2, 16, 8192, 24, torch.bfloat16, "cuda") == (4 * 2**30, 24 * 12 * 2**30)
