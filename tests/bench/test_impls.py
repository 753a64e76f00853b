"""bench/impls.py: each implementation name maps to an attention that computes attention."""

import pytest
import torch

from bench.failures import run_guarded
from bench.impls import IMPL_NAMES, default_impls, make_impl
from bench.inputs import random_inputs

CPU = torch.device("cpu")


def test_impl_registry_names_and_defaults(monkeypatch):
    assert set(IMPL_NAMES) == {"naive", "flash", "flash_two_pass", "flash_fused", "flash_hopper", "flash_portable", "sdpa",
                               "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flex"}
    assert not {"flex", "flash_hopper"} & set(default_impls(CPU))
    for capability in ((9, 0), (8, 0), (10, 0)):  # the Gluon backward runs on sm_90 only
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        expected = [n for n in IMPL_NAMES if capability == (9, 0) or n != "flash_hopper"]
        assert default_impls(torch.device("cuda")) == expected
    with pytest.raises(ValueError, match="naive"):
        make_impl("flash2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors reach our kernel only through the interpreter, "
                    "which a CUDA machine does not start (the GPU suites check flash there)")
@pytest.mark.parametrize("causal", [False, True])
def test_impls_compute_the_same_attention(causal):
    # fp32, tiny: every name that runs on CPU must give softmax(QKᵀ/√d)V; flash runs interpreted.
    q, k, v, _ = random_inputs(1, 2, 16, 16, torch.float32, CPU, requires_grad=False)
    scores = (q.double() @ k.double().transpose(-2, -1)) / 4.0
    if causal:
        scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1) @ v.double()
    for name in ("naive", "flash", "flash_fused", "flash_portable", "sdpa", "sdpa_math", "sdpa_flash"):
        out = make_impl(name)(q, k, v, causal)
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_portable_impl_runs_the_tl_kernels_and_their_gradients(monkeypatch):
    # flash_portable forces forward.py's kernel and the two-pass backward whatever the device
    from kernels.flash_attn import launch

    calls = []
    forward, backward = launch.forward, launch.backward
    monkeypatch.setattr(launch, "forward", lambda *a, **kw: calls.append(("fwd", kw.get("kernel"))) or forward(*a, **kw))
    monkeypatch.setattr(launch, "backward", lambda *a, **kw: calls.append(("bwd", a[8])) or backward(*a, **kw))
    q, k, v, do = random_inputs(1, 2, 16, 16, torch.float32, CPU, requires_grad=True)
    make_impl("flash_portable")(q, k, v, True).backward(do)
    assert calls == [("fwd", "tl"), ("bwd", "two_pass")]
    want = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    make_impl("flash_two_pass")(*want, True).backward(do)  # on CPU the same kernels
    for got, ref in zip((q, k, v), want):
        torch.testing.assert_close(got.grad, ref.grad, rtol=0, atol=0)


def test_pinned_cuda_only_backend_is_unsupported_on_cpu():
    q, k, v, _ = random_inputs(1, 1, 8, 16, torch.float32, CPU, requires_grad=False)
    result, status = run_guarded(lambda: make_impl("sdpa_cudnn")(q, k, v, False), CPU, "sdpa_cudnn")
    assert result is None and status == "unsupported"


def test_flex_builds_without_compiling_yet():
    # Compiling happens at the first call (on the GPU); building only wires the compiled function
    # and lets dynamo keep one static-shape variant per benchmarked shape.
    flex = make_impl("flex")
    config = torch._dynamo.config
    limit = config.recompile_limit if hasattr(config, "recompile_limit") else config.cache_size_limit
    assert callable(flex) and limit >= 64
