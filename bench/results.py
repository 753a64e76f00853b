"""Result files: what every one carries (machine, library versions, date, git revision, the
conventions of its numbers), where they go by default, and writing them atomically.

Default outputs stay out of the tracked tree: `outputs/bench/<YYYY-MM-DD>/<script>/` under the
current folder (outputs/ is git-ignored, as Hydra's run folders are). The committed results under
docs/ are only rewritten when asked for with `--out docs/results/NAME.json`.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import torch

from data.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = Path("outputs") / "bench"


def output_dir(script: str) -> Path:
    """outputs/bench/<today>/<script>, relative to the current folder."""
    return OUTPUTS / date.today().isoformat() / script


def default_out(script: str, filename: str) -> Path:
    return output_dir(script) / filename


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


def run_meta(device: torch.device, convention: str, timer: str | None = "events", **extra: Any) -> dict[str, Any]:
    """What every result file carries: machine, library versions, date, git revision, conventions,
    and how times were taken (timer: one of bench.timing.TIMERS on CUDA; None: nothing is timed)."""
    import triton

    from bench.timing import TIMERS

    return {
        "gpu": device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        "timer": None if timer is None else TIMERS[timer] if device.type == "cuda" else "host perf_counter (median; CPU smoke run)",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "convention": convention,
        **extra,
    }


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, replacing `path` atomically (a run killed mid-write leaves the old
    file); NaN is refused: a measurement that does not exist is null."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, allow_nan=False) + "\n")


def write_results(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], **sections: Any) -> None:
    """{"meta": ..., "rows": [...], **sections} as JSON (see write_json)."""
    write_json(path, {"meta": meta, "rows": rows, **sections})


def write_text(path: Path, text: str) -> None:
    """A markdown table beside its JSON, written the same way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)


def read_results(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def rounded(x: float | None, digits: int = 5) -> float | None:
    """Round to `digits` significant digits for readable JSON; None (not measured) stays None."""
    return None if x is None else float(f"{float(x):.{digits}g}")
