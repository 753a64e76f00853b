"""Plumbing shared by the measurement scripts: result metadata and JSON files, timing, peak
memory, per-point failure handling, random inputs and plain-text tables.

Timing hygiene, written once here so every script measures the same way:
- CUDA: `triton.testing.do_bench` (CUDA events, L2 flushed before each call, median), after a
  warm-up call that compiles/autotunes outside the timed region.
- CPU (smoke runs only): a host timer around the same calls, median; memory is reported as n/a.
- Peak memory: `reset_peak_memory_stats` then `max_memory_allocated` minus what was allocated
  before the call (the inputs), so the number is what the call itself adds.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "results"
PLOTS_DIR = ROOT / "docs"

DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32,
}

# An attention implementation as the scripts see it (same signature as model.attention).
AttnFn = Callable[[Tensor, Tensor, Tensor, bool], Tensor]


# ----------------------------------------------------------------------------------------------
# Names, devices, metadata, JSON
# ----------------------------------------------------------------------------------------------


def parse_dtype(name: str) -> torch.dtype:
    """'bf16' / 'bfloat16' -> torch.bfloat16, etc.; unknown names say which are accepted."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def fill_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace, defaults: dict[str, Any],
                  quick: dict[str, Any], dtype_keys: Sequence[str] = ()) -> argparse.Namespace:
    """Unset flags take `quick` (with --quick) or `defaults`, so explicit flags always win; dtype
    flags named in `dtype_keys` are checked and normalised (a bad one exits with the parser's usage)."""
    for key, value in (quick if args.quick else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        for key in dtype_keys:
            value = getattr(args, key)
            if isinstance(value, list):
                setattr(args, key, [dtype_name(parse_dtype(v)) for v in value])
            else:
                setattr(args, key, dtype_name(parse_dtype(value)))
    except ValueError as err:
        parser.error(str(err))
    return args


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (the spelling used in result rows)."""
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str | None) -> torch.device:
    """None -> cuda when available, else cpu. Asking for cuda without one is an error, not a fallback."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was given but torch sees no CUDA device; use --device cpu for a smoke run")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def git_rev() -> str:
    """Short commit of the repo, '+dirty' when the tree has uncommitted changes; 'unknown' outside git."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_meta(device: torch.device, convention: str, **extra: Any) -> dict[str, Any]:
    """What every result file carries: machine, library versions, date, git revision, conventions."""
    import triton

    return {
        "gpu": device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        "timer": "triton.testing.do_bench (CUDA events, median)" if device.type == "cuda" else "host perf_counter (median; CPU smoke run)",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "convention": convention,
        **extra,
    }


def write_results(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], **sections: Any) -> None:
    """Write {"meta": ..., "rows": [...], **sections} as JSON (written whole, then renamed, so a
    run killed mid-write never leaves a truncated file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows, **sections}, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def read_results(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def rounded(x: float | None, digits: int = 5) -> float | None:
    """Round to `digits` significant digits for readable JSON; None (not measured) stays None."""
    return None if x is None else float(f"{float(x):.{digits}g}")


# ----------------------------------------------------------------------------------------------
# Timing and memory
# ----------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_ms(fn: Callable[[], Any], device: torch.device, warmup_ms: float = 25, rep_ms: float = 50) -> float:
    """Median milliseconds of one call of `fn` (see the module docstring for the method). The
    first call is never timed, so JIT compilation and autotuning stay out of the number."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return _host_bench_ms(fn, warmup_ms, rep_ms)


def _host_bench_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float:
    # Same shape as do_bench: one untimed first call (compiles, and estimates the cost), then
    # warm-up and repetitions sized by the budgets.
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


# ----------------------------------------------------------------------------------------------
# Failures per point: a sweep records them and goes on
# ----------------------------------------------------------------------------------------------


def classify_failure(err: BaseException) -> str:
    """'oom' | 'unsupported' | 'error' for an exception raised while measuring one point.

    oom: the allocator (torch.OutOfMemoryError) or a library (cuBLAS/cuDNN "out of memory") ran
    out. unsupported: the implementation cannot run this shape/dtype/device: SDPA's "No available
    kernel" / "No viable backend", Triton's shared-memory OutOfResources, our kernel's input contract (ValueError),
    NotImplementedError. Anything else is a bug worth reading: 'error', with a traceback printed.
    """
    message = str(err)
    if isinstance(err, torch.OutOfMemoryError) or "out of memory" in message.lower():
        return "oom"
    if isinstance(err, (NotImplementedError, ValueError)) or "No available kernel" in message or "No viable backend" in message:
        return "unsupported"
    if "OutOfResources" in type(err).__name__ or "out of resource" in message.lower():
        return "unsupported"
    return "error"


def run_guarded(fn: Callable[[], Any], device: torch.device, label: str) -> tuple[Any, str]:
    """(fn(), 'ok'), or (None, status) when it raised; prints one line saying why (and the
    traceback for unexpected errors), then frees memory. The exception's frames hold tensors,
    so it is dropped before `release_memory`."""
    status = "ok"
    try:
        return fn(), status
    except Exception as err:  # noqa: BLE001 - a sweep records every failure and goes on
        status = classify_failure(err)
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        print(f"  [{label}] {status}: {type(err).__name__}: {first_line}", flush=True)
        if status == "error":
            traceback.print_exc()
    release_memory(device)
    return None, status


# ----------------------------------------------------------------------------------------------
# Inputs and the two timed calls
# ----------------------------------------------------------------------------------------------


def random_inputs(
    batch: int, heads: int, seqlen: int, head_dim: int, dtype: torch.dtype, device: torch.device,
    requires_grad: bool = True, seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fresh standard-normal q, k, v (B, H, N, D) and an upstream gradient dO (never zeros:
    kernels that skip work on zeros would time something else)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, heads, seqlen, head_dim)
    q, k, v, do = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, do


def step_fns(attn: AttnFn, q: Tensor, k: Tensor, v: Tensor, do: Tensor, causal: bool) -> tuple[Callable[[], Tensor], Callable[[], None]]:
    """(forward, forward+backward) closures. The forward runs on inputs that require grad, as in
    training, so it saves what its backward needs; gradients are returned by autograd.grad, not
    accumulated into .grad, so repeated calls need no zeroing."""

    def forward() -> Tensor:
        return attn(q, k, v, causal)

    def forward_backward() -> None:
        o = attn(q, k, v, causal)
        torch.autograd.grad(o, (q, k, v), do)

    return forward, forward_backward


# ----------------------------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------------------------


def fmt(value: Any, spec: str = ".3g") -> str:
    """A table cell: None -> '-', floats with `spec`, everything else str()."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


class Table:
    """A fixed-width text table printed row by row (the progress lines of a sweep are its rows)."""

    def __init__(self, columns: Sequence[tuple[str, str, int, str]]) -> None:
        # (row key, header, width, float format)
        self.columns = columns

    def header(self) -> str:
        head = " ".join(f"{title:>{width}}" for _, title, width, _ in self.columns)
        return head + "\n" + "-" * len(head)

    def line(self, row: dict[str, Any]) -> str:
        return " ".join(f"{fmt(row.get(key), spec):>{width}}" for key, _, width, spec in self.columns)

    def render(self, rows: Iterable[dict[str, Any]]) -> str:
        return "\n".join([self.header(), *(self.line(r) for r in rows)])

    def markdown(self, rows: Iterable[dict[str, Any]]) -> str:
        lines = ["| " + " | ".join(title for _, title, _, _ in self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(fmt(r.get(key), spec) for key, _, _, spec in self.columns) + " |" for r in rows]
        return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed; files only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
