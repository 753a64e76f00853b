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

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def attention_label(cfg: DictConfig) -> str:
    """naive, sdpa, sdpa-cudnn, flash: the attention choice including a pinned sdpa backend."""
    backend = cfg.attention.get("backend", "auto")
    return cfg.attention.name if backend == "auto" else f"{cfg.attention.name}-{backend}"


def run_name(cfg: DictConfig) -> str:
    """e.g. flash-gpt2-medium-n8192, sdpa-cudnn-tiny-n64: attention, model and seq_len at a glance."""
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
    """Appends one JSON object per call to <out_dir>/metrics.jsonl and mirrors it to wandb."""

    def __init__(self, cfg: DictConfig, out_dir: Path, derived: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self._file = open(out_dir / METRICS_FILE, "a", buffering=1)  # line-buffered: readable while running
        self._wandb = _start_wandb(cfg, out_dir, derived) if cfg.logger.name == "wandb" else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        """Record the run's outcome (status ok/oom, medians, final losses) and close everything."""
        self._file.write(json.dumps({"summary": summary}) + "\n")
        self._file.close()
        (self.out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        if self._wandb is not None:
            self._wandb.summary.update(summary)
            self._wandb.finish(exit_code=0 if summary.get("status") == "ok" else 1)


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
