"""scripts/bench_attention.py: the command line (a smoke run on CPU, --append, bad flags)."""

import pytest
import torch

from bench.results import read_results
from bench.sweep import ROW_KEYS
from scripts import bench_attention

META_KEYS = {"gpu", "torch", "triton", "cuda", "date", "git_rev", "convention"}


@pytest.mark.slow
def test_main_smoke_on_cpu(tmp_path, capsys):
    out = tmp_path / "results" / "bench.json"
    rows = bench_attention.main(["--device", "cpu", "--quick", "--impls", "naive", "sdpa_math", "--seqlens", "16",
                                 "--out", str(out), "--no-plots"])  # plotting: tests/bench/test_plots.py
    data = read_results(out)
    assert META_KEYS <= set(data["meta"]) and data["rows"] == rows
    assert len(rows) == 2 * 2 and all(r["status"] == "ok" for r in rows)
    assert {(r["impl"], r["causal"]) for r in rows} == {(i, c) for i in ("naive", "sdpa_math") for c in (False, True)}
    assert all(tuple(r) == ROW_KEYS and r["dtype"] == "bfloat16" and r["fwd_ms"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "convention" in printed and printed.count("sdpa_math") >= 5  # impl list, a line per point, the final table

    # --append re-measures one impl with flash added (interpreted, one tiny point) and keeps the rest
    more = bench_attention.main(["--device", "cpu", "--quick", "--impls", "flash", "--seqlens", "64", "--heads", "1",
                                 "--causal", "true", "--out", str(out), "--no-plots", "--append"])
    data = read_results(out)
    assert len(more) == 5 and data["rows"] == more and "previous_meta" in data["meta"]
    flash = [r for r in more if r["impl"] == "flash"]
    assert len(flash) == 1 and flash[0]["status"] == "ok" and flash[0]["causal"] is True


def test_bad_flags_fail_with_a_message(capsys):
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--dtypes", "fp8"])
    assert "fp8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--impls", "flash2"])


def test_plots_go_beside_the_results_unless_told():
    args = bench_attention.parse_args(["--out", "somewhere/r.json"])
    assert str(args.plot_dir) == "somewhere"
    args = bench_attention.parse_args([])
    assert args.out.parts[:2] == ("outputs", "bench") and args.plot_dir == args.out.parent
    assert str(bench_attention.parse_args(["--plot-dir", "docs"]).plot_dir) == "docs"


@pytest.mark.slow
def test_mask_rows_on_cpu(tmp_path):
    """--masks: every impl computes the same masked attention as ours, and each row's speed-up is
    against that impl's own causal row; flash_compiled runs our ops inside torch.compile."""
    out = tmp_path / "bench.json"
    rows = bench_attention.main(["--device", "cpu", "--quick", "--masks", "docs_2", "window_16", "--seqlens", "64",
                                 "--heads", "1", "--mask-impls", "flash", "flash_compiled", "sdpa", "--out", str(out)])
    assert read_results(out)["mask_rows"] == rows
    assert {(r["impl"], r["mask"]) for r in rows} == {(i, m) for i in ("flash", "flash_compiled", "sdpa")
                                                      for m in ("docs_2", "window_16")}
    assert all(r["status"] == "ok" and r["fwdbwd_ms"] > 0 for r in rows), rows
    # causal pairs inside 2 documents of 32: 2 · 32·33/2 of 64²; a window of 16: 16·17/2 + 48·16
    visible = {r["mask"]: r["visible_fraction"] for r in rows}
    assert visible == pytest.approx({"docs_2": 1056 / 4096, "window_16": (136 + 48 * 16) / 4096}, abs=1e-4)
    for r in rows:
        if r["impl"] != "flash":
            assert r["max_abs_diff"] is not None and r["max_abs_diff"] < 0.02, r  # bf16 outputs of the same mask


def test_cudagraph_timer_needs_cuda():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench_attention.main(["--device", "cpu", "--quick", "--impls", "naive", "--timer", "cudagraph", "--no-plots"])
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--timer", "wallclock"])


def test_autograd_thread_caller_runs_backwards_on_the_calling_thread_and_restores_the_setting(tmp_path, monkeypatch):
    seen = []
    original = bench_attention.run_sweep

    def spy(*args, **kwargs):  # the setting (thread-local) as the sweep sees it
        seen.append(torch._C._is_multithreading_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(bench_attention, "run_sweep", spy)
    before = torch._C._is_multithreading_enabled()
    out = tmp_path / "bench.json"
    bench_attention.main(["--device", "cpu", "--quick", "--impls", "naive", "--seqlens", "32", "--no-plots",
                          "--autograd-thread", "caller", "--out", str(out)])
    assert seen == [False] and torch._C._is_multithreading_enabled() == before
    assert read_results(out)["meta"]["autograd_thread"] == bench_attention.AUTOGRAD_THREADS["caller"]
    bench_attention.main(["--device", "cpu", "--quick", "--impls", "naive", "--seqlens", "32", "--no-plots", "--out", str(out)])
    assert seen == [False, before]
    assert read_results(out)["meta"]["autograd_thread"] == bench_attention.AUTOGRAD_THREADS["device"]
