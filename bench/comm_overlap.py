"""How much of the ring's communication a profiler trace shows hidden behind compute.

Read from a chrome trace (torch.profiler's export, as train.py's profile=true writes it): GPU
kernels, each an interval on some stream. NCCL runs its transfers as kernels of their own on their
own streams, so a transfer is hidden where some compute kernel runs at the same time on the same
GPU. Ring communication is every NCCL kernel but the gradient reductions of DDP/FSDP (AllReduce,
ReduceScatter), which are not the ring's: our ring's P2P shows as SendRecv, PyTorch's context
parallel rotates K/V by AllGather (its default) or AllToAll (SendRecv kernels).

An NCCL kernel's time includes waiting for its peer, so `hidden_share` is a lower bound on how
well the transfer itself overlaps; `exposed_ms` (ring time with no compute beside it) is what the
step pays for the ring.
"""

from __future__ import annotations

from typing import Any, Iterable

NOT_RING = ("AllReduce", "ReduceScatter")  # data parallelism's gradient traffic


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of (start, end) intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covered(union: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Length of the parts of `union` that `cover` overlaps (both merged)."""
    total, j = 0.0, 0
    for start, end in union:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < end:
            total += min(end, cover[k][1]) - max(start, cover[k][0])
            k += 1
    return total


def ring_overlap(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    """Per profiled step: ring communication ms, the part with no compute beside it, and the share
    hidden. None values where the trace has no ring kernels (cp=1, or a CPU trace)."""
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    ring = _merged((e["ts"], e["ts"] + e["dur"]) for e in nccl if not any(op in e["name"] for op in NOT_RING))
    compute = _merged((e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower())
    ring_us = sum(end - start for start, end in ring)
    if not ring_us:
        return {"ring_comm_ms": None, "ring_exposed_ms": None, "comm_hidden_share": None}
    hidden_us = _covered(ring, compute)
    return {
        "ring_comm_ms": ring_us / steps / 1e3,
        "ring_exposed_ms": (ring_us - hidden_us) / steps / 1e3,
        "comm_hidden_share": hidden_us / ring_us,
    }
