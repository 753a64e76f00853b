"""bench/timing.py on CPU: the host timer's median and the memory reading's n/a."""

import time

import pytest
import torch

from bench.timing import bench_ms, peak_extra_mib

CPU = torch.device("cpu")


def test_host_bench_reports_the_median_of_the_call():
    calls = []

    def sleep():
        calls.append(None)
        time.sleep(0.002)

    ms = bench_ms(sleep, CPU, warmup_ms=1, rep_ms=10)
    assert 2.0 <= ms < 50
    assert len(calls) >= 4  # one untimed first call, then at least three timed ones


def test_no_memory_statistics_on_cpu():
    calls = []
    assert peak_extra_mib(lambda: calls.append(1), CPU) is None and calls == [1]


def test_unknown_or_cuda_only_timers_are_refused_on_cpu():
    with pytest.raises(ValueError, match="timer must be one of"):
        bench_ms(lambda: None, CPU, timer="wallclock")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        bench_ms(lambda: None, CPU, timer="cudagraph")
