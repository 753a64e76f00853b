"""A sweep point that fails is recorded with a reason and the sweep goes on."""

from __future__ import annotations

import traceback
from typing import Any, Callable

import torch

from bench.timing import release_memory


def classify_failure(err: BaseException) -> str:
    """'oom' | 'unsupported' | 'error' for an exception raised while measuring one point.

    oom: the allocator (torch.OutOfMemoryError) or a library (cuBLAS/cuDNN "out of memory") ran
    out. unsupported: the implementation cannot run this shape/dtype/device: SDPA's "No available
    kernel" / "No viable backend", Triton's shared-memory OutOfResources, our kernel's input contract
    (ValueError), NotImplementedError. Anything else is a bug worth reading: 'error', with a traceback.
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
