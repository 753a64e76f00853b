"""scripts/bench_attention.py on CPU: FLOP convention, row schema, the OOM/unsupported paths (simulated),
merging, plotting, and a smoke run of the command line."""

import dataclasses

import pytest
import torch

import kernels  # noqa: F401 - first, so the Triton backend is chosen before anything imports triton
from scripts import bench_attention as bench
from scripts._common import read_results

CPU = torch.device("cpu")
META_KEYS = {"gpu", "torch", "triton", "cuda", "date", "git_rev", "convention"}


def _row(**over):
    row = dict(impl="flash", dtype="bfloat16", head_dim=64, seqlen=1024, batch=16, heads=16, causal=False,
               fwd_ms=None, bwd_ms=None, fwdbwd_ms=None, fwd_tflops=None, bwd_tflops=None, fwdbwd_tflops=None,
               peak_mem_mib=None, status="ok")
    return {**row, **over}


def test_flop_convention_4bhn2d_backward_2p5x():
    # non-causal: 4·B·H·N²·d forward; a backward 2.5x as long runs at the same TFLOP/s
    row = bench.finish_row(_row(fwd_ms=1.0, fwdbwd_ms=3.5))
    fwd_flops = 4 * 16 * 16 * 1024**2 * 64
    assert row["bwd_ms"] == 2.5
    assert row["fwd_tflops"] == pytest.approx(fwd_flops / 1e-3 / 1e12, rel=1e-4)
    assert row["bwd_tflops"] == pytest.approx(row["fwd_tflops"], rel=1e-4)
    assert row["fwdbwd_tflops"] == pytest.approx(row["fwd_tflops"], rel=1e-4)


def test_flop_convention_causal_counts_visible_pairs():
    n = 1024
    full = bench.finish_row(_row(seqlen=n, fwd_ms=1.0, fwdbwd_ms=3.5))
    causal = bench.finish_row(_row(seqlen=n, causal=True, fwd_ms=1.0, fwdbwd_ms=3.5))
    assert causal["fwd_tflops"] / full["fwd_tflops"] == pytest.approx((n + 1) / (2 * n), rel=1e-4)


def test_failed_point_keeps_nulls_and_schema():
    row = bench.finish_row(_row(status="oom"))
    assert tuple(row) == bench.ROW_KEYS
    assert all(row[k] is None for k in bench.ROW_KEYS[7:-1])


def test_sweep_points_hold_tokens_fixed():
    points = bench.sweep_points(["naive", "flash"], ["bf16", "fp16"], [64], [False, True], [4096, 512, 32768], 16384, 16)
    assert len(points) == 2 * 2 * 2 * 3
    assert {p.dtype for p in points} == {"bfloat16", "float16"}
    assert [(p.seqlen, p.batch) for p in points[:3]] == [(512, 32), (4096, 4), (32768, 1)]  # ascending, batch >= 1


def _tiny(impl, seqlen=8, causal=False):
    return bench.Point(impl, "float32", 8, seqlen, 2, 2, causal)


def test_oom_is_recorded_and_the_sweep_goes_on(capsys):
    def oom(q, k, v, causal):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB (simulated)")

    def backward_oom(q, k, v, causal):  # forward fits, backward does not
        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                raise torch.OutOfMemoryError("CUDA out of memory (simulated, backward)")

        return Boom.apply(q) + k + v

    def unsupported(q, k, v, causal):
        raise RuntimeError("No available kernel. Aborting execution.")

    impls = {"oom": oom, "bwd_oom": backward_oom, "unsupported": unsupported, "naive": bench.make_impl("naive"), "missing": None}
    points = [_tiny("oom", 8), _tiny("oom", 16), _tiny("bwd_oom"), _tiny("unsupported"), _tiny("missing"), _tiny("naive", 16, True)]
    seen = []
    rows = bench.run_sweep(points, impls, CPU, warmup_ms=0.1, rep_ms=0.5, on_row=seen.append)
    assert seen == rows and [r["status"] for r in rows] == ["oom", "oom", "oom", "unsupported", "unsupported", "ok"]
    assert rows[2]["fwd_ms"] > 0 and rows[2]["fwd_tflops"] > 0 and rows[2]["fwdbwd_ms"] is None  # forward kept
    assert rows[0]["fwd_ms"] is None
    ok = rows[-1]
    assert ok["fwd_ms"] > 0 and ok["fwdbwd_ms"] > 0
    # a noisy host can time fwd+bwd below fwd; then the backward is not measurable (None)
    assert ok["bwd_ms"] is None or ok["bwd_ms"] == pytest.approx(ok["fwdbwd_ms"] - ok["fwd_ms"], rel=1e-3)
    assert ok["peak_mem_mib"] is None  # CPU: n/a
    assert all(tuple(r) == bench.ROW_KEYS for r in rows)
    assert "simulated" in capsys.readouterr().out


def test_merge_rows_replaces_remeasured_points():
    old = [_row(seqlen=512, fwd_ms=1.0), _row(seqlen=1024, fwd_ms=2.0)]
    new = [_row(seqlen=1024, fwd_ms=3.0), _row(seqlen=2048, fwd_ms=4.0)]
    merged = bench.merge_rows(old, new)
    assert [(r["seqlen"], r["fwd_ms"]) for r in merged] == [(512, 1.0), (1024, 3.0), (2048, 4.0)]


def test_plots_written_with_oom_frontier(tmp_path):
    rows = []
    for causal in (False, True):
        for impl in ("naive", "flash", "mine"):
            for n in (512, 1024, 2048, 4096):
                oom = impl == "naive" and n >= 2048
                b = 16384 // n
                rows.append(_row(impl=impl, seqlen=n, batch=b, causal=causal, status="oom" if oom else "ok",
                                 fwdbwd_ms=None if oom else n / 100, fwdbwd_tflops=None if oom else 100.0,
                                 peak_mem_mib=None if oom else b * n * (n if impl == "naive" else 64) / 2**20))
    rows.append(_row(impl="flash", seqlen=8192, batch=2, fwdbwd_ms=1.0, status="ok"))  # memory n/a (as on CPU)
    paths = bench.plot_results(rows, tmp_path / "plots")
    assert [p.name for p in paths] == list(bench.PLOTS)
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_main_smoke_on_cpu(tmp_path, capsys):
    out = tmp_path / "results" / "bench.json"
    rows = bench.main(["--device", "cpu", "--quick", "--impls", "naive", "sdpa_math", "--seqlens", "16",
                       "--out", str(out), "--no-plots"])  # plotting: test_plots_written_with_oom_frontier
    data = read_results(out)
    assert META_KEYS <= set(data["meta"]) and data["rows"] == rows
    assert len(rows) == 2 * 2 and all(r["status"] == "ok" for r in rows)
    assert {(r["impl"], r["causal"]) for r in rows} == {(i, c) for i in ("naive", "sdpa_math") for c in (False, True)}
    assert all(tuple(r) == bench.ROW_KEYS and r["dtype"] == "bfloat16" and r["fwd_ms"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "convention" in printed and printed.count("sdpa_math") >= 3  # the impl list + a line per point

    # --append re-measures one impl with flash added (interpreted, one tiny point) and keeps the rest
    more = bench.main(["--device", "cpu", "--quick", "--impls", "flash", "--seqlens", "64", "--heads", "1",
                       "--causal", "true", "--out", str(out), "--no-plots", "--append"])
    data = read_results(out)
    assert len(more) == 5 and data["rows"] == more and "previous_meta" in data["meta"]
    flash = [r for r in more if r["impl"] == "flash"]
    assert len(flash) == 1 and flash[0]["status"] == "ok" and flash[0]["causal"] is True


def test_bad_flags_fail_with_a_message(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--dtypes", "fp8"])
    assert "fp8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--impls", "flash2"])


def test_point_is_a_row_prefix():
    assert tuple(f.name for f in dataclasses.fields(bench.Point)) == bench.POINT_KEYS
