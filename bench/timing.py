"""Timing and memory, measured the same way by every script.

- CUDA: `triton.testing.do_bench` (CUDA events, L2 flushed before each call, median), or with
  timer="cudagraph" `do_bench_cudagraph` (the calls replayed from a CUDA graph: GPU time only);
  the first, untimed call compiles and autotunes outside the number.
- CPU (smoke runs only): a host timer around the same calls, median.
- Peak memory: `reset_peak_memory_stats`, then `max_memory_allocated` minus what was allocated
  before the call (the inputs), so the number is what the call itself adds.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# How a CUDA call is timed. "events": each call alone between CUDA events after an L2 flush, so
# the host's launch work is in the number when it is longer than the GPU's (short sequences).
# "cudagraph": the calls captured in a CUDA graph and replayed, so only GPU time counts, as in a
# training step whose launches run ahead of the GPU (L2 not flushed between calls).
TIMERS = {
    "events": "triton.testing.do_bench (CUDA events, L2 flushed, median)",
    "cudagraph": "triton.testing.do_bench_cudagraph (calls captured in a CUDA graph and replayed: GPU time, "
                 "no host launch work; L2 not flushed; median)",
}


def bench_ms(fn: Callable[[], Any], device: torch.device, warmup_ms: float = 25, rep_ms: float = 50,
             timer: str = "events") -> float:
    """Median milliseconds of one call of `fn`; the first call is never timed. timer: one of TIMERS
    on CUDA; the CPU always uses the host clock."""
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(map(repr, TIMERS))}, got {timer!r}")
    if device.type == "cuda":
        from triton.testing import do_bench, do_bench_cudagraph

        if timer == "cudagraph":
            return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    if timer == "cudagraph":
        raise ValueError("timer='cudagraph' replays CUDA graphs and needs a CUDA device; on the CPU use timer='events'")
    return _host_bench_ms(fn, warmup_ms, rep_ms)


def _host_bench_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float:
    # Hand-written because do_bench needs a GPU driver (it times with device events; under the CPU
    # interpreter it finds none). Same shape as do_bench: one untimed first call (compiles, and
    # estimates the cost), then warm-up and repetitions sized by the budgets.
    start = time.perf_counter()
    fn()
    estimate_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    for _ in range(min(100, int(warmup_ms / estimate_ms))):
        fn()
    times = []
    for _ in range(max(3, min(1000, int(rep_ms / estimate_ms)))):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def peak_extra_mib(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak memory allocated during one call of `fn` minus what was allocated before it, in MiB
    (None on CPU, where torch keeps no allocator statistics)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def release_memory(device: torch.device) -> None:
    """Give cached blocks back after a point (above all after an OOM) so the next point starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
