"""scripts/tune_flash.py (needs kernels.flash_attn.launch): the grids and tile flags, and smoke runs of
the tuning through the interpreter."""

import argparse
import json

import pytest
import torch

from kernels.flash_attn.launch import KERNELS, kernel_config
from scripts import tune_flash


def test_knobs_cross_the_grid_default_tile_first():
    grid = tune_flash.grid([32, 64], [128], [4], [3])
    crossed = tune_flash.with_knobs(grid, ["TMA"], {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3})
    assert [(c["BLOCK_M"], c["TMA"]) for c in crossed] == [(64, False), (64, True), (32, False), (32, True)]
    assert tune_flash.with_knobs(grid, [], {"BLOCK_M": 1, "BLOCK_N": 1, "num_warps": 1, "num_stages": 1}) == grid


def test_tiles_parse_and_reject_typos():
    assert tune_flash.parse_tile("64x128x8x3") == dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3)
    with pytest.raises(argparse.ArgumentTypeError, match="BLOCK_MxBLOCK_NxWARPSxSTAGES"):
        tune_flash.parse_tile("64x128x8")


def test_fused_backward_tuning_smoke_run(tmp_path, capsys):
    out = tmp_path / "tune.json"
    # one tiny causal shape; a budget that lets the first config of the grid run, then stops
    results = tune_flash.main(["--device", "cpu", "--seqlen", "32", "--tokens", "32", "--heads", "1", "--head-dims", "16",
                               "--causal", "true", "--kernels", "bwd_fused", "--budget-s", "0.1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert {"gpu", "torch", "triton", "date", "git_rev"} <= set(data) and data["results"] == results
    (r,) = results
    tried = r["all"]["bwd_fused"]
    default = kernel_config("bwd_fused", 16, torch.bfloat16, True)  # the grid's first tile: the default's
    first = dict(BLOCK_M=default.BLOCK_M, BLOCK_N=default.BLOCK_N, num_warps=default.num_warps, num_stages=default.num_stages)
    assert tried and tried[0] == {**first, "ms": tried[0]["ms"], "err": tried[0]["err"], "wrong": False}
    assert r["bwd_fused"]["best"][0]["err"] < 0.05 and r["default_bwd_fused_err_vs_sdpa"] < 0.05
    assert r["default_bwd_fused_ms"] > 0 and r["default_bwd_ms"] > 0
    assert set(r["program_order_ms"]) == set(KERNELS)  # causal: both orders of each kernel
    assert all(set(ms) == {"REVERSE=False", "REVERSE=True"} for ms in r["program_order_ms"].values())
    assert set(r["default_cfg"]) == set(KERNELS)
    assert "fused backward best" in capsys.readouterr().out


def test_tiles_and_knobs_smoke_run(tmp_path):
    out = tmp_path / "tune.json"
    (r,) = tune_flash.main(["--device", "cpu", "--seqlen", "32", "--tokens", "32", "--heads", "1", "--head-dims", "16",
                            "--causal", "false", "--kernels", "bwd_dq", "--knobs", "TMA", "--tiles", "32x32x4x2",
                            "--budget-s", "30", "--out", str(out)])
    tried = r["all"]["bwd_dq"]
    assert [(t["BLOCK_M"], t["BLOCK_N"], t["TMA"]) for t in tried] == [(32, 32, False), (32, 32, True)]
    assert not any(t["wrong"] for t in tried)  # both load paths give the default config's dQ
