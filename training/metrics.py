"""Where metrics go: always JSON lines in the run folder, optionally a wandb run.

One set of names everywhere (metrics.jsonl, summary.json, wandb). Per step: train/loss, val/loss,
lr, perf/step_ms, perf/tokens_per_s, perf/mfu, perf/hfu, perf/peak_mem_gib, train/tokens, time/elapsed_s.
Per run (the summary): final/val_loss, final/train_loss, final/step_ms_median, final/tokens_per_s_median,
final/mfu_median, final/hfu_median, final/peak_mem_gib (and, known at the start: checkpointing,
loss_chunk, memory/estimated_gib): named apart from the per-step values they aggregate, so no
view can mistake one step's number for the run's. Only rank 0 should build a MetricsLogger; the
wandb side is training/wandb_run.py.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from data.files import atomic_write
from training.checkpoint import find_checkpoint

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
TOKENS, ELAPSED = "train/tokens", "time/elapsed_s"  # added to every step's row by MetricsLogger.log


def attention_label(cfg: DictConfig) -> str:
    """naive, sdpa, sdpa_cudnn (sdpa_flash, ...), flash, flash_two_pass: the attention choice including
    a pinned sdpa backend or flash's deterministic (two-pass) backward. The same names as the
    benchmarks' implementations, so a run and a benchmark row of one variant carry one name."""
    if cfg.attention.name == "flash" and cfg.attention.get("deterministic", "auto") is True:
        return "flash_two_pass"
    backend = cfg.attention.get("backend", "auto")
    return cfg.attention.name if backend == "auto" else f"{cfg.attention.name}_{backend}"


def run_name(cfg: DictConfig) -> str:
    """e.g. flash-gpt2-medium-n8192, sdpa_cudnn-tiny-n64: attention, model and seq_len at a glance."""
    return f"{attention_label(cfg)}-{cfg.model.name}-n{cfg.seq_len}"


class MetricsLogger:
    """Appends one JSON object per call to <out_dir>/metrics.jsonl and mirrors it to wandb.

    Each step's row gains `train/tokens` (tokens trained on so far) and `time/elapsed_s` (seconds
    since training started), both continued across a resume, so runs of different seq_len or
    speed can share an x-axis. Each line goes to the file in one unbuffered write, so a run killed
    at any moment (even by SIGKILL) leaves only whole lines; a line torn anyway (disk full, power
    loss) is closed off by the next run that appends (resume), and read_jsonl skips it.
    """

    def __init__(self, cfg: DictConfig, out_dir: Path, derived: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.tokens_per_step = cfg.batch_size * cfg.seq_len  # all ranks' tokens
        self._file = open(out_dir / METRICS_FILE, "ab", buffering=0)  # unbuffered: readable while running
        if self._file.tell() > 0 and (out_dir / METRICS_FILE).read_bytes()[-1:] != b"\n":
            log.warning("%s ends in a torn line (a run killed mid-write?); starting on a new line", self._file.name)
            self._write(b"\n")
        self._wandb = None
        if cfg.logger.name == "wandb":
            from training.wandb_run import WandbRun  # imports wandb: only when asked for

            self._wandb = WandbRun(cfg, out_dir, derived)
        self.t0 = time.monotonic() - _elapsed_before(cfg, out_dir, derived.get("start_step", 0))  # after wandb's start

    def _write(self, data: bytes) -> None:
        while data:  # one write() for a line, looping only if the OS takes part of it
            data = data[self._file.write(data) :]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One step's row; `step` counts optimizer steps done, including those before a resume."""
        row = {**metrics, TOKENS: step * self.tokens_per_step, ELAPSED: round(time.monotonic() - self.t0, 3)}
        self._write((json.dumps({"step": step, **row}) + "\n").encode())
        if self._wandb is not None:
            self._wandb.log(step, row)

    def log_constants(self, step: int, values: dict[str, float]) -> None:
        """Numbers that hold for every step (the FLOP split of one step): a metrics.jsonl line at
        `step`, and wandb summary values (not history: they do not change over the run)."""
        self._write((json.dumps({"step": step, **values}) + "\n").encode())
        if self._wandb is not None:
            self._wandb.log_constants(values)

    def finish(self, summary: dict[str, Any]) -> None:
        """Record the run's outcome (status ok/oom, medians, final losses) and close everything."""
        self._write((json.dumps({"summary": summary}) + "\n").encode())
        self._file.close()
        atomic_write(self.out_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")  # never half a summary
        if self._wandb is not None:
            self._wandb.finish(summary)


class NoMetrics:
    """What ranks other than 0 log metrics to: nothing (rank 0's MetricsLogger holds the run's numbers)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_constants(self, step: int, values: dict[str, float]) -> None:
        pass

    def finish(self, summary: dict[str, Any]) -> None:
        pass


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, skipping (with a warning) lines that are not whole JSON
    objects: the torn last line of a run killed mid-write, closed off when the run resumed."""
    records, torn = [], []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            torn.append(number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            torn.append(number)
    if torn:
        log.warning("%s: skipped %d unreadable line(s) (torn by an interrupted write?): line %s", path, len(torn), torn)
    return records


def _elapsed_before(cfg: DictConfig, out_dir: Path, start_step: int) -> float:
    """Seconds of training before a resume: the resumed step's time/elapsed_s in the metrics.jsonl
    beside the checkpoint (0 for a new run, or a checkpoint whose folder has no such row)."""
    if not cfg.resume or not start_step:
        return 0.0
    metrics = find_checkpoint(cfg.resume, out_dir).parent / METRICS_FILE
    rows = [r for r in read_jsonl(metrics) if r.get("step") == start_step] if metrics.exists() else []
    return float(rows[-1].get(ELAPSED, 0.0)) if rows else 0.0


# Reading run folders (the writer's counterpart)

HYDRA_CONFIG = Path(".hydra") / "config.yaml"  # the composed config Hydra saves in each run folder
# summary keys of run folders written before the final/* names: read under the new ones
OLD_SUMMARY_KEYS = {"perf/step_ms": "final/step_ms_median", "perf/tokens_per_s": "final/tokens_per_s_median",
                    "perf/mfu": "final/mfu_median", "perf/peak_mem_gib": "final/peak_mem_gib"}


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders at or below `paths`: those with a Hydra config or a metrics file."""
    runs = set()
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"{root} does not exist; pass run folders or the outputs/ or multirun/ folders above them")
        runs |= {p.parent.parent for p in root.rglob(HYDRA_CONFIG.as_posix())}
        runs |= {p.parent for p in root.rglob(METRICS_FILE)}
    return sorted(runs)


def read_summary(run: Path) -> tuple[dict[str, Any] | None, int]:
    """(the run's summary or None, number of logged steps): the summary line of metrics.jsonl,
    else summary.json (a run killed while finishing may have torn the line but written the file);
    older runs' perf/* aggregates under their final/* names."""
    steps, summary = 0, None
    if (run / METRICS_FILE).exists():
        for record in read_jsonl(run / METRICS_FILE):  # skips a line torn by a killed run
            if "summary" in record:
                summary = record["summary"]
            else:
                steps += 1
    if summary is None and (run / SUMMARY_FILE).exists():
        summary = json.loads((run / SUMMARY_FILE).read_text())
    if summary is not None:
        summary = {OLD_SUMMARY_KEYS.get(key, key): value for key, value in summary.items()}
    return summary, steps
