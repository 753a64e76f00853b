"""bench/failures.py: a failure's class, and a guarded call that records it and goes on."""

import pytest
import torch

from bench.failures import classify_failure, run_guarded

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "err, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB"), "oom"),
        (RuntimeError("CUDA error: out of memory"), "oom"),
        (RuntimeError("No available kernel. Aborting execution."), "unsupported"),
        (RuntimeError("No viable backend for scaled_dot_product_attention was found."), "unsupported"),
        (ValueError("head_dim is 512; flash_attention supports head_dim up to 256"), "unsupported"),
        (NotImplementedError("no fp8"), "unsupported"),
        (type("OutOfResources", (Exception,), {})("out of resource: shared memory"), "unsupported"),
        (RuntimeError("illegal memory access"), "error"),
        (KeyError("x"), "error"),
    ],
)
def test_classify_failure(err, expected):
    assert classify_failure(err) == expected


def test_run_guarded_records_and_continues(capsys):
    def boom():
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    assert run_guarded(boom, CPU, "point A") == (None, "oom")
    assert run_guarded(lambda: 42, CPU, "point B") == (42, "ok")
    out = capsys.readouterr().out
    assert "point A" in out and "oom" in out and "point B" not in out
