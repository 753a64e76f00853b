"""profile=true: a torch.profiler trace of three steps after warm-up, and the share of step time
spent in attention, so a run shows how much of its step the attention choice decides.

Attention is found by operator name: our kernel's custom ops (flashgpt::flash_attn_fwd/bwd) and
PyTorch's SDPA family (aten::scaled_dot_product_attention and the backend ops it dispatches to,
forward and backward). torch.compile keeps these as calls through the dispatcher, so they are
visible in compiled runs too. Their time is GPU kernel time on CUDA (CPU time on CPU), divided by
the wall time of the profiled training steps (each ends in a host sync, so its wall time covers
its GPU work). A training step is the span the loop marks TRAIN_STEP, not the profiler's whole
step: that also holds the evaluation after the last step (with its compilation: 22 s in one
long-context run, which put attention at 21% of a step it filled most of), checkpoints and logging.
Attention operators count where they start inside a training step, whichever thread runs them
(autograd runs the CUDA backward on a thread of its own). `attention=naive` is plain matmuls and
softmax, fused by the compiler with their neighbours: it has no operator of its own, and its share
is reported as unknown.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import DictConfig
from torch.autograd import DeviceType

from data.files import atomic_path, atomic_write

log = logging.getLogger(__name__)

PROFILE_FILE = "profile.json"
TRACE_FILE = "trace.json"
ACTIVE_STEPS = 3  # profiled steps, after one skipped and one warm-up step
# the first step (1-based) after the profiler's: steps 2 to 5 run under its tracing (warm-up included)
FIRST_UNTRACED_STEP = 1 + 1 + ACTIVE_STEPS + 1
TRAIN_STEP = "train_step"  # record_function label of the loop's optimizer step (forward, backward, update)
# Substrings of operator names that are attention (outermost match counted: SDPA's dispatch
# to _scaled_dot_product_flash_attention etc. is nested inside it and not counted twice).
ATTENTION_OPS = ("flashgpt::flash_attn", "scaled_dot_product", "_flash_attention", "_efficient_attention",
                 "_cudnn_attention", "flex_attention")


def _is_attention(name: str) -> bool:
    return any(part in name for part in ATTENTION_OPS)


def attention_share(events: list[Any], on_gpu: bool) -> dict[str, Any]:
    """Per profiled step: wall ms, attention ms and their ratio, from a profiler's FunctionEvents."""
    # the host's span of each training step (TRAIN_STEP; without those marks, the profiler's
    # "ProfilerStep#3" spans). On CUDA each span also has a GPU-side twin (a gpu_user_annotation
    # with no CPU time), which must not count as another step.
    steps = [e for e in events if e.name == TRAIN_STEP and e.device_type == DeviceType.CPU]
    marked = bool(steps)
    if not marked:
        steps = [e for e in events if e.name.startswith("ProfilerStep") and e.device_type == DeviceType.CPU]
    step_us = sum(e.cpu_time_total for e in steps)
    spans = [(e.time_range.start, e.time_range.end) for e in steps] if marked else []

    def in_step(e: Any) -> bool:
        return not marked or any(start <= e.time_range.start <= end for start, end in spans)

    def nested(e: Any) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if _is_attention(parent.name):
                return True
            parent = parent.cpu_parent
        return False

    by_op: dict[str, float] = {}
    for e in events:
        if _is_attention(e.name) and not nested(e) and in_step(e):
            us = e.device_time_total if on_gpu else e.cpu_time_total
            by_op[e.name] = by_op.get(e.name, 0.0) + us
    n = max(1, len(steps))
    attention_us = sum(by_op.values())
    return {
        "steps_profiled": len(steps),
        "step_ms": step_us / n / 1e3,
        "attention_ms": attention_us / n / 1e3 if by_op else None,
        "attention_share": attention_us / step_us if by_op and step_us else None,
        "attention_ops_ms": {name: us / n / 1e3 for name, us in sorted(by_op.items())},
        "time": "GPU kernel time of the attention operators" if on_gpu else "CPU time of the attention operators",
        "of": "wall time of the profiled steps",
    }


def profiler_recording(prof: torch.profiler.profile | None) -> bool:
    """Did the step that just ended run under the profiler's tracing (its warm-up or its recorded
    steps)? Those steps are slower than the others, so the summary's speed leaves them out."""
    return prof is not None and prof.current_action != torch.profiler.ProfilerAction.NONE


@contextlib.contextmanager
def step_profiler(cfg: DictConfig, out_dir: Path, report: dict[str, Any], main: bool = True,
                  ) -> Iterator[torch.profiler.profile | None]:
    """profile=true: trace steps 3-5 into <out_dir>/trace.json and fill `report` with their
    attention share (also written to <out_dir>/profile.json); rank 0 only."""
    if not cfg.profile or not main:
        yield None
        return
    on_gpu = torch.cuda.is_available() and str(cfg.device) != "cpu"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def ready(prof: torch.profiler.profile) -> None:
        with atomic_path(out_dir / TRACE_FILE) as tmp:
            prof.export_chrome_trace(str(tmp))
        report.update(attention_share(list(prof.events()), on_gpu))
        atomic_write(out_dir / PROFILE_FILE, json.dumps(report, indent=2) + "\n")
        if report["attention_share"] is None:
            log.info("profile: %.1f ms per step; attention has no operator of its own here (attention=%s is "
                     "fused into the model's kernels), so its share is unknown; trace in %s",
                     report["step_ms"], cfg.attention.name, out_dir / TRACE_FILE)
        else:
            log.info("profile: attention %.1f of %.1f ms per step (%.1f%%); trace in %s", report["attention_ms"],
                     report["step_ms"], 100 * report["attention_share"], out_dir / TRACE_FILE)

    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE_STEPS, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        yield prof
