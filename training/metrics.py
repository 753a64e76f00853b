"""Where metrics go: always JSON lines in the run folder, optionally a wandb run.

One set of names everywhere: train/loss, val/loss, lr, perf/step_ms, perf/tokens_per_s,
perf/mfu, perf/peak_mem_gib. Only the main process (rank 0) should build a MetricsLogger.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data.files import atomic_write

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


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


def run_group(cfg: DictConfig) -> str:
    """The wandb group: logger.group if set, else the experiment name, else the -m sweep folder."""
    if cfg.logger.get("group"):
        return str(cfg.logger.group)
    from hydra.core.hydra_config import HydraConfig  # only set when launched through @hydra.main

    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.runtime.choices.get("experiment") not in (None, "null"):
            return str(hc.runtime.choices["experiment"])
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            return "sweep-" + "-".join(Path(hc.sweep.dir).parts[-2:])  # multirun/<date>/<time>
    return "default"


class MetricsLogger:
    """Appends one JSON object per call to <out_dir>/metrics.jsonl and mirrors it to wandb.

    Each line goes to the file in one unbuffered write, so a run killed at any moment (even by
    SIGKILL) leaves only whole lines; a line torn anyway (disk full, power loss) is closed off by
    the next run that appends (resume), and read_jsonl skips it.
    """

    def __init__(self, cfg: DictConfig, out_dir: Path, derived: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self._file = open(out_dir / METRICS_FILE, "ab", buffering=0)  # unbuffered: readable while running
        if self._file.tell() > 0 and (out_dir / METRICS_FILE).read_bytes()[-1:] != b"\n":
            log.warning("%s ends in a torn line (a run killed mid-write?); starting on a new line", self._file.name)
            self._write(b"\n")
        self._wandb = _start_wandb(cfg, out_dir, derived) if cfg.logger.name == "wandb" else None

    def _write(self, data: bytes) -> None:
        while data:  # one write() for a line, looping only if the OS takes part of it
            data = data[self._file.write(data) :]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._write((json.dumps({"step": step, **metrics}) + "\n").encode())
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        """Record the run's outcome (status ok/oom, medians, final losses) and close everything."""
        self._write((json.dumps({"summary": summary}) + "\n").encode())
        self._file.close()
        atomic_write(self.out_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")  # never half a summary
        if self._wandb is not None:
            self._wandb.summary.update(summary)
            self._wandb.finish(exit_code=0 if summary.get("status") == "ok" else 1)


class NoMetrics:
    """What ranks other than 0 log metrics to: nothing (rank 0's MetricsLogger holds the run's numbers)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
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


def _start_wandb(cfg: DictConfig, out_dir: Path, derived: dict[str, Any]) -> Any:
    import wandb  # imported here: slow to import, and logger=none should not need it

    lg = cfg.logger
    tags = [attention_label(cfg), cfg.model.name, f"seq{cfg.seq_len}", *lg.tags]
    run = wandb.init(
        project=lg.project,
        entity=lg.entity,
        mode=lg.mode,
        group=run_group(cfg),
        name=run_name(cfg),
        tags=tags,
        config={**OmegaConf.to_container(cfg, resolve=True), "derived": derived},
        dir=str(out_dir),  # offline runs land in <out_dir>/wandb/offline-run-*
        settings=wandb.Settings(console="off"),  # Hydra's train.log already keeps the console
    )
    log.info("wandb: mode=%s project=%s group=%s name=%s dir=%s", lg.mode, lg.project, run.group, run.name, out_dir)
    return run


# Reading run folders (the writer's counterpart)

HYDRA_CONFIG = Path(".hydra") / "config.yaml"  # the composed config Hydra saves in each run folder


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
    else summary.json (a run killed while finishing may have torn the line but written the file)."""
    steps, summary = 0, None
    if (run / METRICS_FILE).exists():
        for record in read_jsonl(run / METRICS_FILE):  # skips a line torn by a killed run
            if "summary" in record:
                summary = record["summary"]
            else:
                steps += 1
    if summary is None and (run / SUMMARY_FILE).exists():
        summary = json.loads((run / SUMMARY_FILE).read_text())
    return summary, steps
