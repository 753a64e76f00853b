"""scripts/tune_flash.py on CPU: a smoke run of the fused-backward tuning through the interpreter."""

import json

import kernels  # noqa: F401 - first, so the Triton backend is chosen before anything imports triton
from scripts import tune_flash


def test_fused_backward_tuning_smoke_run(tmp_path, capsys):
    out = tmp_path / "tune.json"
    # one tiny causal shape; a budget that lets the first config of the grid run, then stops
    results = tune_flash.main(["--device", "cpu", "--seqlen", "32", "--tokens", "32", "--heads", "1", "--head-dims", "16",
                               "--causal", "true", "--kernels", "bwd_fused", "--budget-s", "0.1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert {"gpu", "torch", "triton", "date", "git_rev"} <= set(data) and data["results"] == results
    (r,) = results
    tried = r["all"]["bwd_fused"]
    assert tried and tried[0] == {**tune_flash.GRIDS["bwd_fused"][0], "ms": tried[0]["ms"], "err": tried[0]["err"], "wrong": False}
    assert r["bwd_fused"]["best"][0]["err"] < 0.05 and r["default_bwd_fused_err_vs_sdpa"] < 0.05
    assert r["default_bwd_fused_ms"] > 0 and r["default_bwd_ms"] > 0
    assert set(r["program_order_ms"]) == {"fwd", "bwd_dkdv", "bwd_dq", "bwd_fused"}  # causal: both orders of each kernel
    assert all(set(ms) == {"REVERSE=False", "REVERSE=True"} for ms in r["program_order_ms"].values())
    assert set(r["default_cfg"]) == {"fwd", "bwd_dkdv", "bwd_dq", "bwd_fused"}
    assert "fused backward best" in capsys.readouterr().out
