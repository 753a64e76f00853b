"""bench/sweep.py on CPU: FLOP convention, row schema, the OOM/unsupported paths (simulated), merging."""

import dataclasses

import pytest
import torch

from bench import sweep
from bench.impls import make_impl

CPU = torch.device("cpu")


def _row(**over):
    row = dict(impl="flash", dtype="bfloat16", head_dim=64, seqlen=1024, batch=16, heads=16, causal=False,
               fwd_ms=None, bwd_ms=None, fwdbwd_ms=None, fwd_tflops=None, bwd_tflops=None, fwdbwd_tflops=None,
               peak_mem_mib=None, status="ok")
    return {**row, **over}


def test_flop_convention_4bhn2d_backward_2p5x():
    # non-causal: 4·B·H·N²·d forward; a backward 2.5x as long runs at the same TFLOP/s
    row = sweep.finish_row(_row(fwd_ms=1.0, fwdbwd_ms=3.5))
    fwd_flops = 4 * 16 * 16 * 1024**2 * 64
    assert row["bwd_ms"] == 2.5
    assert row["fwd_tflops"] == pytest.approx(fwd_flops / 1e-3 / 1e12, rel=1e-4)
    assert row["bwd_tflops"] == pytest.approx(row["fwd_tflops"], rel=1e-4)
    assert row["fwdbwd_tflops"] == pytest.approx(row["fwd_tflops"], rel=1e-4)


def test_flop_convention_causal_counts_visible_pairs():
    n = 1024
    full = sweep.finish_row(_row(seqlen=n, fwd_ms=1.0, fwdbwd_ms=3.5))
    causal = sweep.finish_row(_row(seqlen=n, causal=True, fwd_ms=1.0, fwdbwd_ms=3.5))
    assert causal["fwd_tflops"] / full["fwd_tflops"] == pytest.approx((n + 1) / (2 * n), rel=1e-4)


def test_failed_point_keeps_nulls_and_schema():
    row = sweep.finish_row(_row(status="oom"))
    assert tuple(row) == sweep.ROW_KEYS
    assert all(row[k] is None for k in sweep.ROW_KEYS[7:-1])


def test_sweep_points_hold_tokens_fixed():
    points = sweep.sweep_points(["naive", "flash"], ["bf16", "fp16"], [64], [False, True], [4096, 512, 32768], 16384, 16)
    assert len(points) == 2 * 2 * 2 * 3
    assert {p.dtype for p in points} == {"bfloat16", "float16"}
    assert [(p.seqlen, p.batch) for p in points[:3]] == [(512, 32), (4096, 4), (32768, 1)]  # ascending, batch >= 1


def test_sweep_points_interleaved_put_the_impls_of_a_shape_together():
    args = (["flash", "sdpa_cudnn"], ["bf16"], [64, 128], [True], [8192, 1024], 16384, 16)
    plain, mixed = sweep.sweep_points(*args), sweep.sweep_points(*args, interleave=True)
    assert sorted(map(str, plain)) == sorted(map(str, mixed))  # the same points, another order
    assert [p.impl for p in plain[:4]] == ["flash"] * 4
    assert [(p.impl, p.head_dim, p.seqlen) for p in mixed[:4]] == [
        ("flash", 64, 1024), ("sdpa_cudnn", 64, 1024), ("flash", 64, 8192), ("sdpa_cudnn", 64, 8192)]


def test_the_timer_reaches_every_measurement(monkeypatch):
    timers = []
    monkeypatch.setattr(sweep, "bench_ms", lambda fn, device, warmup_ms, rep_ms, timer: timers.append(timer) or 1.0)
    rows = sweep.run_sweep([_tiny("naive")], {"naive": make_impl("naive")}, CPU, 0.1, 0.5, timer="cudagraph")
    assert timers == ["cudagraph"] * 2 and rows[0]["fwdbwd_ms"] == 1.0  # forward, forward+backward


def test_point_is_a_row_prefix():
    assert tuple(f.name for f in dataclasses.fields(sweep.Point)) == sweep.POINT_KEYS


def _tiny(impl, seqlen=8, causal=False):
    return sweep.Point(impl, "float32", 8, seqlen, 2, 2, causal)


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

    impls = {"oom": oom, "bwd_oom": backward_oom, "unsupported": unsupported, "naive": make_impl("naive"), "missing": None}
    points = [_tiny("oom", 8), _tiny("oom", 16), _tiny("bwd_oom"), _tiny("unsupported"), _tiny("missing"), _tiny("naive", 16, True)]
    seen = []
    rows = sweep.run_sweep(points, impls, CPU, warmup_ms=0.1, rep_ms=0.5, on_row=seen.append)
    assert seen == rows and [r["status"] for r in rows] == ["oom", "oom", "oom", "unsupported", "unsupported", "ok"]
    assert rows[2]["fwd_ms"] > 0 and rows[2]["fwd_tflops"] > 0 and rows[2]["fwdbwd_ms"] is None  # forward kept
    assert rows[0]["fwd_ms"] is None
    ok = rows[-1]
    assert ok["fwd_ms"] > 0 and ok["fwdbwd_ms"] > 0
    # a noisy host can time fwd+bwd below fwd; then the backward is not measurable (None)
    assert ok["bwd_ms"] is None or ok["bwd_ms"] == pytest.approx(ok["fwdbwd_ms"] - ok["fwd_ms"], rel=1e-3)
    assert ok["peak_mem_mib"] is None  # CPU: n/a
    assert all(tuple(r) == sweep.ROW_KEYS for r in rows)
    assert "simulated" in capsys.readouterr().out


def test_merge_rows_replaces_remeasured_points():
    old = [_row(seqlen=512, fwd_ms=1.0), _row(seqlen=1024, fwd_ms=2.0)]
    new = [_row(seqlen=1024, fwd_ms=3.0), _row(seqlen=2048, fwd_ms=4.0)]
    merged = sweep.merge_rows(old, new)
    assert [(r["seqlen"], r["fwd_ms"]) for r in merged] == [(512, 1.0), (1024, 3.0), (2048, 4.0)]
