"""scripts/_common.py and scripts/_impls.py: failure classification, JSON files, timing, inputs,
tables, and that each implementation name maps to an attention that computes attention."""

import json
import math
import time

import pytest
import torch

import kernels  # noqa: F401 - first, so the Triton backend is chosen before anything imports triton
from scripts import _common as common
from scripts._impls import IMPL_NAMES, default_impls, make_impl

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "err, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB"), "oom"),
        (RuntimeError("CUDA error: out of memory"), "oom"),
        (RuntimeError("No available kernel. Aborting execution."), "unsupported"),
        (RuntimeError("No viable backend for scaled_dot_product_attention was found."), "unsupported"),
        (ValueError("head_dim is 512; flash_attention supports head_dim up to 256"), "unsupported"),
        (NotImplementedError("no fp8"), "unsupported"),
        (type("OutOfResources", (Exception,), {})("out of resource: shared memory"), "unsupported"),
        (RuntimeError("illegal memory access"), "error"),
        (KeyError("x"), "error"),
    ],
)
def test_classify_failure(err, expected):
    assert common.classify_failure(err) == expected


def test_run_guarded_records_and_continues(capsys):
    def boom():
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    assert common.run_guarded(boom, CPU, "point A") == (None, "oom")
    assert common.run_guarded(lambda: 42, CPU, "point B") == (42, "ok")
    out = capsys.readouterr().out
    assert "point A" in out and "oom" in out and "point B" not in out


def test_run_meta_has_machine_versions_and_conventions():
    meta = common.run_meta(CPU, "some convention", extra_key=1)
    for key in ("gpu", "torch", "triton", "cuda", "date", "git_rev", "convention"):
        assert key in meta
    assert meta["torch"] == torch.__version__ and meta["convention"] == "some convention" and meta["extra_key"] == 1
    json.dumps(meta)  # must be serialisable as is


def test_write_results_round_trip_and_refuses_nan(tmp_path):
    path = tmp_path / "sub" / "r.json"
    common.write_results(path, {"gpu": "x"}, [{"a": 1, "b": None}], extra=[1, 2])
    assert common.read_results(path) == {"meta": {"gpu": "x"}, "rows": [{"a": 1, "b": None}], "extra": [1, 2]}
    with pytest.raises(ValueError):  # NaN is not JSON; measurements that do not exist are None
        common.write_results(path, {}, [{"a": math.nan}])


def test_rounded_keeps_significant_digits():
    assert common.rounded(None) is None
    assert common.rounded(123456.789) == 123460.0
    assert common.rounded(0.000123456789) == 0.00012346


def test_parse_dtype_and_name():
    assert common.parse_dtype("bf16") is torch.bfloat16 and common.parse_dtype("float16") is torch.float16
    assert common.dtype_name(torch.bfloat16) == "bfloat16" and common.dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError, match="bfloat16"):
        common.parse_dtype("fp8")


def test_host_bench_reports_the_median_of_the_call():
    ms = common.bench_ms(lambda: time.sleep(0.002), CPU, warmup_ms=1, rep_ms=10)
    assert 2.0 <= ms < 50
    assert common.peak_extra_mib(lambda: None, CPU) is None  # no allocator statistics on CPU


def test_random_inputs_fresh_nonzero_and_differentiable():
    q, k, v, do = common.random_inputs(2, 3, 5, 4, torch.bfloat16, CPU)
    assert q.shape == (2, 3, 5, 4) and q.dtype is torch.bfloat16
    assert q.requires_grad and k.requires_grad and v.requires_grad and not do.requires_grad
    assert all(t.count_nonzero() > 0.9 * t.numel() for t in (q, k, v, do))
    assert not torch.equal(q, k)
    q2 = common.random_inputs(2, 3, 5, 4, torch.bfloat16, CPU, seed=1)[0]
    assert not torch.equal(q, q2)


def test_step_fns_do_forward_and_backward_without_accumulating():
    q, k, v, do = common.random_inputs(1, 1, 4, 8, torch.float32, CPU)
    calls = []

    def attn(q, k, v, causal):
        calls.append(causal)
        return (q * k * v).sum(-1, keepdim=True).expand_as(q)

    forward, forward_backward = common.step_fns(attn, q, k, v, do, True)
    assert forward().shape == q.shape
    forward_backward()
    forward_backward()
    assert calls == [True, True, True] and q.grad is None


def test_table_text_and_markdown():
    table = common.Table([("a", "A", 5, ""), ("b", "B", 6, ".2f")])
    rows = [{"a": "x", "b": 1.234}, {"a": "y", "b": None}]
    text = table.render(rows)
    assert text.splitlines()[0].split() == ["A", "B"] and "1.23" in text and text.splitlines()[-1].split() == ["y", "-"]
    md = table.markdown(rows).splitlines()
    assert md[0] == "| A | B |" and md[1] == "|---|---|" and md[2] == "| x | 1.23 |"


def test_impl_registry_names_and_defaults():
    assert set(IMPL_NAMES) == {"naive", "flash", "flash_fused", "sdpa", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flex"}
    assert "flex" not in default_impls(CPU) and default_impls(torch.device("cuda")) == list(IMPL_NAMES)
    with pytest.raises(ValueError, match="naive"):
        make_impl("flash2")


@pytest.mark.parametrize("causal", [False, True])
def test_impls_compute_the_same_attention(causal):
    # fp32, tiny: every name that runs on CPU must give softmax(QKᵀ/√d)V; flash runs interpreted.
    q, k, v, _ = common.random_inputs(1, 2, 16, 16, torch.float32, CPU, requires_grad=False)
    scores = (q.double() @ k.double().transpose(-2, -1)) / 4.0
    if causal:
        scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1) @ v.double()
    for name in ("naive", "flash", "flash_fused", "sdpa", "sdpa_math", "sdpa_flash"):
        out = make_impl(name)(q, k, v, causal)
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_pinned_cuda_only_backend_is_unsupported_on_cpu():
    q, k, v, _ = common.random_inputs(1, 1, 8, 16, torch.float32, CPU, requires_grad=False)
    result, status = common.run_guarded(lambda: make_impl("sdpa_cudnn")(q, k, v, False), CPU, "sdpa_cudnn")
    assert result is None and status == "unsupported"


def test_flex_builds_without_compiling_yet():
    # Compiling happens at the first call (on the GPU); building only wires the compiled function
    # and lets dynamo keep one static-shape variant per benchmarked shape.
    flex = make_impl("flex")
    config = torch._dynamo.config
    limit = config.recompile_limit if hasattr(config, "recompile_limit") else config.cache_size_limit
    assert callable(flex) and limit >= 64
