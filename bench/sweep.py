"""The attention sweep's unit: one row per (impl, dtype, head_dim, seqlen, batch, heads, causal)
point with forward, backward and forward+backward time, TFLOP/s and extra peak memory.
Used by bench_attention.py (the sweep) and profile_backward.py (its times beside the profile)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import torch

from bench.cli import dtype_name, parse_dtype
from bench.failures import run_guarded
from bench.impls import AttnFn, make_impl
from bench.inputs import random_inputs, step_fns
from bench.results import rounded
from bench.timing import bench_ms, peak_extra_mib, release_memory
from kernels.flops import attention_flops

ROW_KEYS = (
    "impl", "dtype", "head_dim", "seqlen", "batch", "heads", "causal",
    "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_tflops", "bwd_tflops", "fwdbwd_tflops", "peak_mem_mib", "status",
)
POINT_KEYS = ROW_KEYS[:7]  # what identifies a point (used to merge runs with --append)

CONVENTION = (
    "FLOPs per (batch, head): forward 4*d*pairs, backward 10*d*pairs (2.5x forward, the recomputing "
    "backward's count, used for every impl so TFLOP/s compare like for like), fwd+bwd 14*d*pairs; "
    "pairs = N^2 without mask, N(N+1)/2 causal (exact visible pairs, i.e. the usual 'halved' figure). "
    "Times: median ms of triton.testing.do_bench (CUDA events, L2 flushed) after a warm-up call; "
    "bwd_ms = fwdbwd_ms - fwd_ms (null if noise makes it <= 0), the forward timed on inputs that require grad (as in training). "
    "peak_mem_mib: peak allocated during one forward+backward minus what was allocated before it "
    "(q, k, v, dO); it includes the output and the gradients. batch = max(1, tokens // seqlen). "
    "status: ok | oom | unsupported | error; failed points have null measurements (a forward that "
    "succeeded before the backward failed keeps its numbers)."
)


@dataclasses.dataclass(frozen=True)
class Point:
    impl: str
    dtype: str
    head_dim: int
    seqlen: int
    batch: int
    heads: int
    causal: bool

    def label(self) -> str:
        return f"{self.impl} {self.dtype} d={self.head_dim} N={self.seqlen} causal={self.causal}"


def sweep_points(
    impls: Iterable[str], dtypes: Iterable[str], head_dims: Iterable[int], causals: Iterable[bool],
    seqlens: Iterable[int], tokens: int, heads: int, interleave: bool = False,
) -> list[Point]:
    """Every point of the sweep, one implementation after another (in the order given, so the
    compile-heavy flex, last by default, cannot hold up the others), each walking up in seqlen
    (its OOM frontier reads top to bottom in the printed table). interleave: the implementations
    of each shape back to back instead, so the ratios between them are measured seconds apart
    rather than a whole sweep apart (a machine's speed can drift over that time)."""
    shapes = [(dtype_name(parse_dtype(dt)), d, causal, n)
              for dt in dtypes for d in head_dims for causal in causals for n in sorted(seqlens)]
    order = [(impl, shape) for shape in shapes for impl in impls] if interleave else \
        [(impl, shape) for impl in impls for shape in shapes]
    return [Point(impl, dt, d, n, max(1, tokens // n), heads, causal) for impl, (dt, d, causal, n) in order]


def tflops(flops: int, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flops / (ms * 1e-3) / 1e12


def bench_point(point: Point, attn: AttnFn | None, device: torch.device, warmup_ms: float, rep_ms: float,
                timer: str = "events") -> dict[str, Any]:
    """One result row. Forward first, then forward+backward, so a point whose backward does not
    fit still reports its forward."""
    row: dict[str, Any] = {**dataclasses.asdict(point), **{k: None for k in ROW_KEYS[7:]}}
    if attn is None:  # the implementation could not even be built (reported when it was tried)
        row["status"] = "unsupported"
        return row

    def measure() -> None:
        q, k, v, do = random_inputs(point.batch, point.heads, point.seqlen, point.head_dim, parse_dtype(point.dtype), device)
        forward, forward_backward = step_fns(attn, q, k, v, do, point.causal)
        # bench_ms's first, untimed call compiles/autotunes; memory is read after that, on a warm call
        row["fwd_ms"] = bench_ms(forward, device, warmup_ms, rep_ms, timer)
        row["fwdbwd_ms"] = bench_ms(forward_backward, device, warmup_ms, rep_ms, timer)
        row["peak_mem_mib"] = peak_extra_mib(forward_backward, device)

    _, row["status"] = run_guarded(measure, device, point.label())
    release_memory(device)
    return finish_row(row)


def finish_row(row: dict[str, Any]) -> dict[str, Any]:
    """Derive bwd_ms and the TFLOP/s columns from the measured times (see CONVENTION)."""
    args = (row["batch"], row["heads"], row["seqlen"], row["seqlen"], row["head_dim"], row["causal"])
    fwd_flops, bwd_flops = attention_flops(*args, pass_="fwd"), attention_flops(*args, pass_="bwd")
    if row["fwd_ms"] is not None and row["fwdbwd_ms"] is not None and row["fwdbwd_ms"] > row["fwd_ms"]:
        row["bwd_ms"] = row["fwdbwd_ms"] - row["fwd_ms"]  # not measurable (None) if noise puts it <= 0
    row["fwd_tflops"] = tflops(fwd_flops, row["fwd_ms"])
    row["bwd_tflops"] = tflops(bwd_flops, row["bwd_ms"])
    row["fwdbwd_tflops"] = tflops(fwd_flops + bwd_flops, row["fwdbwd_ms"])
    for key in ROW_KEYS[7:-1]:
        row[key] = rounded(row[key])
    return {key: row[key] for key in ROW_KEYS}


def build_impls(names: Iterable[str], device: torch.device) -> dict[str, AttnFn | None]:
    """name -> attention function, or None when it cannot be built here (e.g. no FlexAttention)."""
    return {name: run_guarded(lambda: make_impl(name), device, f"{name} (building)")[0] for name in names}


def run_sweep(
    points: Iterable[Point], impls: Mapping[str, AttnFn | None], device: torch.device,
    warmup_ms: float, rep_ms: float, on_row: Callable[[dict[str, Any]], None] | None = None, timer: str = "events",
) -> list[dict[str, Any]]:
    """Measure every point in order (timer: bench.timing.TIMERS); `on_row` sees each row as soon as it exists."""
    rows = []
    for point in points:
        rows.append(bench_point(point, impls[point.impl], device, warmup_ms, rep_ms, timer))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def merge_rows(old: Iterable[dict[str, Any]], new: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of `old` not re-measured in `new`, then `new` (for --append)."""
    new = list(new)
    measured = {tuple(r[k] for k in POINT_KEYS) for r in new}
    return [r for r in old if tuple(r[k] for k in POINT_KEYS) not in measured] + new
