"""scripts/profile_backward.py on CPU: kernel-name classification, per-iteration aggregation, and a smoke run."""

import pytest

from bench.results import read_results
from scripts import profile_backward as pb


@pytest.mark.parametrize(
    "name, expected",
    [
        ("_fwd_kernel", "fwd"),
        ("_attn_fwd", "fwd"),
        ("_bwd_preprocess_kernel", "preprocess"),
        ("_bwd_dkdv_kernel", "dkdv"),
        ("_attn_bwd_dkdv", "dkdv"),
        ("_bwd_dq_kernel", "dq"),
        ("_bwd_fused_kernel", "bwd_other"),
        ("_attn_bwd_dq", "dq"),
        ("_attn_bwd", "bwd_other"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
        ("Memset (Device)", "other"),
    ],
)
def test_classify_kernel(name, expected):
    assert pb.classify_kernel(name) == expected


def test_kernel_ms_per_iter_sums_by_class():
    events = [("_fwd_kernel", 1000.0), ("_bwd_preprocess_kernel", 100.0), ("_bwd_dkdv_kernel", 1500.0),
              ("_bwd_dq_kernel", 900.0), ("_fwd_kernel", 1000.0), ("_bwd_dkdv_kernel", 1500.0), ("fill", 50.0)]
    ms = pb.kernel_ms_per_iter(events, iters=2)
    assert ms == {"fwd": 1.0, "preprocess": 0.05, "dkdv": 1.5, "dq": 0.45, "bwd_other": 0.0, "other": 0.025}


@pytest.mark.slow
def test_flop_ratios_recompute_vs_stored_p(tmp_path):
    rows = pb.main(["--device", "cpu", "--quick", "--heads", "1", "--causal", "true", "--iters", "1", "--out", str(tmp_path / "bp.json"),
                    "--impls", "flash", "flash_fused", "naive"])
    assert [(r["impl"], r["flop_ratio"]) for r in rows] == [
        ("flash", pytest.approx(2.5)), ("flash_fused", pytest.approx(2.5)), ("naive", pytest.approx(2.0))]
    data = read_results(tmp_path / "bp.json")
    assert data["rows"] == rows and "convention" in data["meta"]
    for row in rows:
        assert row["status"] == "ok" and row["fwd_ms"] > 0 and row["kernel_ms"] is None  # no GPU kernels on CPU
    md = (tmp_path / "bp.md").read_text()
    assert [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("|")][2:] == ["flash", "flash_fused", "naive"]
