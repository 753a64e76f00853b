"""HBM bytes measured by Nsight Compute.

The profiled program is a child process (`python -m bench.ncu_child`, see there) run under
`ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum --profile-from-start off`:
it warms up (compiles, autotunes) first, then brackets exactly one pass with
cudaProfilerStart/Stop, so only that pass's kernels are counted; the bytes are summed over them.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

import torch

from bench.inputs import Shape
from bench.results import ROOT

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
CHILD_MODULE = "bench.ncu_child"

# Scale of the units ncu may print (SI prefixes, as Nsight Compute uses; binary ones just in case).
BYTE_UNITS = {"byte": 1, "bytes": 1, "b": 1, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9, "gb": 1e9,
              "tbyte": 1e12, "tb": 1e12, "kibyte": 2**10, "kib": 2**10, "mibyte": 2**20, "mib": 2**20, "gibyte": 2**30, "gib": 2**30}


def child_args(impl: str, shape: Shape, device: torch.device, pass_: str = "fwdbwd",
               block_m: int | None = None, block_n: int | None = None) -> list[str]:
    """The command-line arguments of `python -m bench.ncu_child` for one profiled pass."""
    args = [impl, "--pass", pass_, "--device", str(device), "--batch", str(shape.batch), "--heads", str(shape.heads),
            "--seqlen", str(shape.seqlen), "--head-dim", str(shape.head_dim), "--dtype", shape.dtype,
            "--causal" if shape.causal else "--no-causal"]
    for flag, value in (("--block-m", block_m), ("--block-n", block_n)):
        if value is not None:
            args += [flag, str(value)]
    return args


def parse_ncu_csv(text: str, metrics: Iterable[str] = NCU_METRICS) -> tuple[dict[str, float], int]:
    """Sum each metric over all profiled kernels of `ncu --csv` output, in bytes; also return the
    number of kernels. ncu's own lines (==PROF==, warnings) and the program's output around the
    table are skipped; values may carry thousands separators and scaled units (Kbyte, Mbyte, ...)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    totals = {m: 0.0 for m in metrics}
    if start is None:
        return totals, 0
    kernels = set()
    for row in csv.DictReader(lines[start:]):
        name = row.get("Metric Name")
        if name not in totals or not (row.get("ID") or "").strip().isdigit():
            continue
        unit = (row.get("Metric Unit") or "byte").strip().lower()
        if unit not in BYTE_UNITS:
            raise ValueError(f"ncu printed {name} in unit {row['Metric Unit']!r}; expected one of {sorted(BYTE_UNITS)}")
        totals[name] += float(row["Metric Value"].replace(",", "")) * BYTE_UNITS[unit]
        kernels.add(row["ID"])
    return totals, len(kernels)


def ncu_command(ncu: str, log_file: Path, args: list[str]) -> list[str]:
    return [ncu, "--clock-control", "none", "--metrics", ",".join(NCU_METRICS), "--csv", "--print-units", "base",
            "--target-processes", "all", "--profile-from-start", "off", "--log-file", str(log_file),
            sys.executable, "-m", CHILD_MODULE, *args]


def measure_hbm_ncu(ncu: str, args: list[str], timeout_s: float = 600) -> tuple[float, float, int] | None:
    """(read GB, write GB, kernels) of the child's profiled pass, or None (with the reason printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        log_file = Path(tmp) / "ncu.csv"
        cmd = ncu_command(ncu, log_file, args)
        try:
            # from the repo root, so `-m bench.ncu_child` finds this checkout's bench/
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        except subprocess.TimeoutExpired:
            print(f"  ncu: timed out after {timeout_s:.0f} s: {' '.join(cmd)}", flush=True)
            return None
        text = log_file.read_text() if log_file.exists() else ""
        totals, kernels = parse_ncu_csv(text)
        if kernels == 0:  # some ncu versions print the table to stdout despite --log-file
            totals, kernels = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or kernels == 0:
        tail = "\n    ".join((text + proc.stdout + proc.stderr).strip().splitlines()[-8:])
        print(f"  ncu: no measurement (exit {proc.returncode}, {kernels} kernels); last output:\n    {tail}", flush=True)
        return None
    read_gb, write_gb = totals["dram__bytes_read.sum"] / 1e9, totals["dram__bytes_write.sum"] / 1e9
    print(f"  ncu: {kernels} kernels profiled: {read_gb:.3f} GB read, {write_gb:.3f} GB written", flush=True)
    return read_gb, write_gb, kernels
