"""scripts/paper_table.py (needs kernels.flash_attn.launch for its block study): the markdown beside the
paper's numbers, and a smoke run on CPU."""

import pytest

from bench.inputs import Shape
from bench.results import read_results
from scripts import paper_table

PAPER = Shape(batch=64, heads=16, seqlen=1024, head_dim=64, dtype="float16", causal=True)


def test_markdown_sits_beside_the_paper():
    rows = [
        dict(impl="naive", gflops_fwd=137.4, gflops_bwd=274.9, gflops_fwd_counted=137.4, gflops_bwd_counted=274.9,
             hbm_read_gb=25.0, hbm_write_gb=16.0, hbm_source="ncu", runtime_ms=10.0, status="ok"),
        dict(impl="flash", gflops_fwd=68.8, gflops_bwd=172.0, gflops_fwd_counted=68.8, gflops_bwd_counted=172.0,
             hbm_read_gb=2.0, hbm_write_gb=1.0, hbm_source="ncu", runtime_ms=2.0, status="ok"),
    ]
    blocks = [dict(impl="flash", block_m=128, block_n=32, fwd_ms=0.5, hbm_read_gb=1.0, hbm_write_gb=0.1, hbm_source="analytic",
                   max_abs_diff_vs_default=0.0, status="ok")]
    meta = dict(gpu="NVIDIA H200", torch="2.11", triton="3.6", cuda="13.0", date="today", git_rev="abc")
    text = paper_table.markdown(meta, PAPER, rows, blocks)
    for expected in ("66.6", "75.2", "40.3", "4.4", "41.7", "7.3", "flash (ours)", "NVIDIA H200",
                     "HBM traffic naive / ours = 13.7x (ncu)", "runtime naive / ours = 5.0x", "Block-size study", "| 128 "):
        assert expected in text


def test_main_smoke_on_cpu(tmp_path):
    out = tmp_path / "pt.json"
    result = paper_table.main(["--device", "cpu", "--batch", "1", "--heads", "1", "--seqlen", "64", "--head-dim", "16",
                               "--impls", "naive", "sdpa_math", "--block-n", "32", "--rep-ms", "1", "--warmup-ms", "1", "--out", str(out)])
    data = read_results(out)
    assert data["rows"] == result["rows"] and {"gpu", "torch", "triton", "cuda", "date", "git_rev"} <= set(data["meta"])
    assert [r["impl"] for r in data["rows"]] == ["naive", "sdpa_math"]
    for row in data["rows"]:
        assert set(paper_table.ROW_KEYS) == set(row) and row["status"] == "ok" and row["hbm_source"] == "analytic"
        assert row["runtime_ms"] > 0 and row["gflops_fwd_counted"] == pytest.approx(row["gflops_fwd"], rel=1e-3)
    [block] = data["block_study"]
    assert block["block_n"] == 32 and block["status"] == "ok" and block["fwd_ms"] > 0 and block["hbm_source"] == "analytic"
    assert block["max_abs_diff_vs_default"] < 1e-2  # forcing tiles must not change the result
    assert "paper A100" in out.with_suffix(".md").read_text()
