"""training/profiling.py: the attention share of step time, from synthetic profiler events and from real runs."""

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch.autograd import DeviceType

from training import train
from training.loop import steady_step_time
from training.profiling import TRAIN_STEP, attention_share, profiler_recording, step_profiler


def ev(name, cpu_us=0.0, gpu_us=0.0, device=DeviceType.CPU, parent=None, start=0.0):
    """A stand-in for torch.autograd.profiler's FunctionEvent: the fields attention_share reads."""
    return SimpleNamespace(name=name, cpu_time_total=cpu_us, device_time_total=gpu_us, device_type=device,
                           cpu_parent=parent, time_range=SimpleNamespace(start=start, end=start + cpu_us))


def test_attention_share_counts_each_step_once_on_cuda():
    """On CUDA the profiler lists every step twice (host span + GPU annotation with no CPU time); the
    H200 runs showed the per-step numbers halved before this was handled."""
    steps = [ev(f"ProfilerStep#{i}", cpu_us=145_000) for i in (2, 3, 4)]
    twins = [ev(f"ProfilerStep#{i}", gpu_us=143_000, device=DeviceType.CUDA) for i in (2, 3, 4)]
    fwd = [ev("flashgpt::flash_attn_fwd", cpu_us=50, gpu_us=17_000, parent=s) for s in steps]
    bwd = [ev("flashgpt::flash_attn_bwd", cpu_us=60, gpu_us=50_000) for _ in steps]  # autograd thread: no parent
    sdpa = ev("aten::scaled_dot_product_attention", gpu_us=1_000, parent=steps[0])
    inner = ev("aten::_scaled_dot_product_cudnn_attention", gpu_us=1_000, parent=sdpa)  # inside sdpa: not again
    report = attention_share([*steps, *twins, *fwd, *bwd, sdpa, inner], on_gpu=True)
    assert report["steps_profiled"] == 3 and report["step_ms"] == pytest.approx(145.0)
    assert report["attention_ms"] == pytest.approx((3 * 67_000 + 1_000) / 3 / 1e3)
    assert report["attention_share"] == pytest.approx((3 * 67_000 + 1_000) / (3 * 145_000))
    assert set(report["attention_ops_ms"]) == {"flashgpt::flash_attn_fwd", "flashgpt::flash_attn_bwd",
                                               "aten::scaled_dot_product_attention"}


def test_attention_share_on_cpu_uses_cpu_time_and_counts_nested_ops_once():
    steps = [ev(f"ProfilerStep#{i}", cpu_us=10_000) for i in (2, 3)]
    sdpa = [ev("aten::scaled_dot_product_attention", cpu_us=1_500, gpu_us=99, parent=s) for s in steps]
    inner = [ev("aten::_scaled_dot_product_flash_attention", cpu_us=1_400, parent=s) for s in sdpa]
    backward = ev("aten::_scaled_dot_product_flash_attention_backward", cpu_us=3_000)  # autograd thread: no parent
    report = attention_share([*steps, *sdpa, *inner, backward, ev("aten::mm", cpu_us=4_000, parent=steps[0])], on_gpu=False)
    assert report["steps_profiled"] == 2 and report["step_ms"] == pytest.approx(10.0)
    assert report["attention_ms"] == pytest.approx((2 * 1_500 + 3_000) / 2 / 1e3)  # CPU time; inner ops not again
    assert report["attention_share"] == pytest.approx(6_000 / 20_000)
    assert report["attention_ops_ms"] == pytest.approx({"aten::scaled_dot_product_attention": 1.5,
                                                         "aten::_scaled_dot_product_flash_attention_backward": 1.5})


def test_attention_share_counts_training_steps_only():
    """The profiler's steps also hold what the loop does after a training step: here the last one
    runs the evaluation (2.5 s with its compilation, as at 64K tokens on the H200, where it put
    attention at 21% of the step). Only the marked training steps count, and attention inside
    them, also from the backward's thread (no parent, inside the span by time)."""
    profiler_steps = [ev(f"ProfilerStep#{i}", cpu_us=100_000, start=i * 1e6) for i in (2, 3)]
    profiler_steps.append(ev("ProfilerStep#4", cpu_us=2_600_000, start=4e6))
    train = [ev(TRAIN_STEP, cpu_us=90_000, start=i * 1e6 + 10) for i in (2, 3, 4)]
    twins = [ev(TRAIN_STEP, gpu_us=89_000, device=DeviceType.CUDA, start=i * 1e6 + 10) for i in (2, 3, 4)]
    fwd = [ev("flashgpt::flash_attn_fwd", cpu_us=50, gpu_us=20_000, parent=t, start=t.time_range.start + 100) for t in train]
    bwd = [ev("flashgpt::flash_attn_bwd", cpu_us=60, gpu_us=40_000, start=t.time_range.start + 50_000) for t in train]
    evaluation = ev("flashgpt::flash_attn_fwd", cpu_us=50, gpu_us=20_000, start=4e6 + 200_000)  # after step 4's span
    report = attention_share([*profiler_steps, *train, *twins, *fwd, *bwd, evaluation], on_gpu=True)
    assert report["steps_profiled"] == 3 and report["step_ms"] == pytest.approx(90.0)
    assert report["attention_ms"] == pytest.approx(60.0)
    assert report["attention_share"] == pytest.approx(60 / 90)


def test_no_attention_operator_means_an_unknown_share_not_zero():
    steps = [ev("ProfilerStep#2", cpu_us=5_000)]
    report = attention_share([*steps, ev("aten::mm", cpu_us=2_000, parent=steps[0]), ev("aten::softmax", cpu_us=500)],
                             on_gpu=False)
    assert report["attention_ms"] is None and report["attention_share"] is None and report["attention_ops_ms"] == {}
    assert attention_share([], on_gpu=True)["steps_profiled"] == 0  # nothing profiled: no division by zero


@pytest.mark.slow
@pytest.mark.parametrize("attention, op", [("sdpa", "scaled_dot_product"), ("flash", "flashgpt::flash_attn")])
def test_profile_writes_a_trace_and_the_attention_share(tiny_cfg, pattern_data, attention, op):
    cfg = tiny_cfg(f"attention={attention}", "profile=true")
    summary = train(cfg)
    trace = json.loads((Path(cfg.out_dir) / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("name") == TRAIN_STEP for e in trace) == 3  # the spans the share is measured against
    report = json.loads((Path(cfg.out_dir) / "profile.json").read_text())
    assert report["steps_profiled"] == 3
    # forward and backward both counted, each once (SDPA's inner backend op is nested, not added)
    ops = report["attention_ops_ms"]
    assert any(op in name and "bwd" in name or "backward" in name for name in ops), ops
    assert all(op in name for name in ops), ops
    assert 0 < report["attention_ms"] < report["step_ms"]
    assert report["attention_share"] == pytest.approx(report["attention_ms"] / report["step_ms"])
    assert summary["profile/attention_share"] == report["attention_share"]


@pytest.mark.slow
def test_profile_of_naive_attention_says_its_share_is_unknown(tiny_cfg, pattern_data, caplog):
    cfg = tiny_cfg("attention=naive", "profile=true")
    with caplog.at_level(logging.INFO):
        summary = train(cfg)
    assert json.loads((Path(cfg.out_dir) / "profile.json").read_text())["attention_share"] is None
    assert "profile/attention_share" not in summary and "its share is unknown" in caplog.text


def test_profiler_traces_steps_2_to_5_and_the_speed_leaves_them_out(tmp_path):
    # profile=true's tracing slows the steps it covers (its warm-up too): the summary's median
    # step time must come from the others, else a profiled run reads slower than an unprofiled one
    cfg = OmegaConf.create({"profile": True, "device": "cpu", "attention": {"name": "sdpa"}})
    traced = []
    with step_profiler(cfg, tmp_path, {}) as prof:
        for _ in range(7):
            with torch.profiler.record_function(TRAIN_STEP):
                torch.ones(8, 8) @ torch.ones(8, 8)
            traced.append(profiler_recording(prof))
            prof.step()
    assert traced == [False, True, True, True, True, False, False]
    times = [9.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.2]
    assert steady_step_time(times, traced) == pytest.approx(1.1)  # steps 6-7: no compilation, no tracing
    assert steady_step_time(times[:5], traced[:5]) == 2.0  # nothing untraced after step 1: the traced steps
    assert steady_step_time([9.0, 1.0, 3.0], [False] * 3) == 2.0  # no profiler: every step after the first
    assert steady_step_time([9.0], [False]) == 9.0
    assert not profiler_recording(None)
