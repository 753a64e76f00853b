"""The wandb side of a run (logger=wandb): names, config, x-axis and summaries that compare right.

- Names: `<attention>-<model>-n<seq_len>-<MMDD-HHMMSS>` (plus `-<job>` in a -m sweep), unique and
  readable; group: logger.group, else one group per -m sweep, else the experiment, else "default".
- Config: the resolved values at the top level (dtype, compile, device, batch_size, tokens_per_step
  as they ran, not `auto`/null), the derived numbers, the flash kernel's launch settings, whether
  the Triton interpreter ran, and the library and GPU names.
- History: every metric against `train/tokens` (define_metric), so runs of different seq_len line
  up; per-step perf values get no summary of their own (a last step is not the run's speed).
- Summary: exactly summary.json (median step time as final/step_ms_median, ...) plus the per-step
  FLOP split. Each step is committed when logged, so no late history row lands after the summary.
- Resume: the run's id is kept in <run folder>/wandb_run.json; `resume=<that folder>` continues the
  same wandb run (resume="allow"), its history going on from the resumed step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from data.files import atomic_write
from training.checkpoint import find_checkpoint
from training.metrics import run_name

log = logging.getLogger(__name__)

WANDB_RUN_FILE = "wandb_run.json"  # {"id", "name", "group", "project"}: what a resumed run continues
TOKENS = "train/tokens"  # the x-axis: tokens trained on so far (all ranks), continued across a resume
# define_metric summaries of per-step values (None: wandb's default, the last value); the run's
# aggregates are the final/* keys, set once at the end
STEP_SUMMARIES = {"train/loss": "min,last", "val/loss": "min,last", "perf/*": "none", "lr": None,
                  "time/elapsed_s": None, "train/skipped_steps": None}
# flash's `tl` backward kernels per schedule (kernels.flash_attn.launch.SCHEDULES): what its launch
# settings list ("hopper": the Gluon backward's settings, launch.hopper_backward_config's, shown as bwd_hopper)
BACKWARD_KERNELS = {"two_pass": ("bwd_dq", "bwd_dkdv"), "fused": ("bwd_fused",), "hopper": ()}


def names(cfg: DictConfig) -> tuple[str, str]:
    """(display name, group) of a new run; see the module docstring."""
    from hydra.core.hydra_config import HydraConfig  # only set when launched through @hydra.main

    name = f"{run_name(cfg)}-{time.strftime('%m%d-%H%M%S')}"
    experiment, sweep = None, None
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.runtime.choices.get("experiment") not in (None, "null"):
            experiment = str(hc.runtime.choices["experiment"])
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            sweep = "sweep-" + "-".join(Path(hc.sweep.dir).parts[-2:])  # multirun/<date>/<time>
            name += f"-{hc.job.num}"  # jobs of one sweep may start within the same second
    if cfg.logger.get("group"):
        return name, str(cfg.logger.group)
    if sweep:
        return name, f"{experiment}-{sweep}" if experiment else sweep
    return name, experiment or "default"


def kernel_settings(cfg: DictConfig, dtype: str, device: str) -> dict[str, Any] | None:
    """attention=flash: the forward kernel and backward schedule that run, and their launch settings
    (tiles, warps, stages, REVERSE, TMA) for this model's head_dim, seq_len, masks, dtype and device;
    None for naive and sdpa."""
    if cfg.attention.name != "flash":
        return None
    # the kernels' own (private) resolution rules, so that what is shown is what runs, with no second copy
    from kernels.flash_attn import _schedule
    from kernels.flash_attn.launch import (
        HOPPER_FORWARD,
        _launch_args,
        _table_key,
        fastest_forward,
        fastest_schedule,
        hopper_backward_config,
        kernel_config,
    )

    deterministic = cfg.attention.get("deterministic", "auto")
    schedule = _schedule(None if deterministic == "auto" else bool(deterministic))  # as flash_attention resolves it
    head_dim = cfg.model.n_embd // cfg.model.n_head
    # one (batch 1, one head) sequence of the run's length: what the picks read (no memory behind it)
    q = torch.empty(1, 1, 1, head_dim, dtype=getattr(torch, dtype), device=device).expand(1, 1, cfg.seq_len, head_dim)
    documents = bool(cfg.data.get("document_mask", False))  # what the Hopper kernels don't take (windows they do)
    if schedule == "fastest":  # what launch.backward picks for such a q
        schedule = fastest_schedule(q, q, documents)
    forward = fastest_forward(q, q, documents)  # what launch.forward picks (deterministic either way)
    settings: dict[str, Any] = {
        "forward_kernel": forward,
        "backward_schedule": schedule,
        "tma": "where the tensors' layout allows it (kernels.flash_attn.launch.tma_ok)",
    }
    block_d = _launch_args(q)["BLOCK_D"]  # the head dim as the launchers pad it
    if forward == "hopper":
        settings["fwd_hopper"] = dataclasses.asdict(HOPPER_FORWARD[_table_key(head_dim, q.dtype)])
    else:
        settings["fwd"] = dataclasses.asdict(kernel_config("fwd", block_d, q.dtype, causal=True))
    for kernel in BACKWARD_KERNELS[schedule]:
        settings[kernel] = dataclasses.asdict(kernel_config(kernel, block_d, q.dtype, causal=True))
    if schedule == "hopper":
        window = cfg.attention.get("window") is not None  # attention.window: the sliding-window table
        settings["bwd_hopper"] = dataclasses.asdict(hopper_backward_config(head_dim, q.dtype, window=window))
    return settings


def run_config(cfg: DictConfig, derived: dict[str, Any]) -> dict[str, Any]:
    """The wandb config: what ran, resolved (see the module docstring)."""
    import triton

    from kernels.flash_attn.launch import interpreting

    config = OmegaConf.to_container(cfg, resolve=True)
    resolved = {key: derived[key] for key in ("dtype", "compile", "device", "tokens_per_step") if key in derived}
    config.update(resolved, batch_size=cfg.batch_size, attention_label=derived.get("attention"))
    config["derived"] = derived
    config["kernel"] = kernel_settings(cfg, derived.get("dtype", "float32"), derived.get("device", "cpu"))
    config["system"] = {
        "gpu": derived.get("device_name"), "triton_interpreter": interpreting(), "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }
    return config


def previous_run(cfg: DictConfig, out_dir: Path) -> dict[str, Any] | None:
    """When resuming: the wandb run recorded beside the checkpoint (None if there is none)."""
    if not cfg.resume:
        return None
    path = find_checkpoint(cfg.resume, out_dir).parent / WANDB_RUN_FILE
    return json.loads(path.read_text()) if path.exists() else None


class WandbRun:
    """One wandb run, mirroring MetricsLogger: log() per step, log_constants() once, finish() at the end."""

    def __init__(self, cfg: DictConfig, out_dir: Path, derived: dict[str, Any]) -> None:
        import wandb  # imported here: slow to import, and logger=none should not need it

        lg, self.out_dir = cfg.logger, out_dir
        before = previous_run(cfg, out_dir)
        name, group = (before["name"], before["group"]) if before else names(cfg)
        self.run = wandb.init(
            project=lg.project, entity=lg.entity, mode=lg.mode, group=group, name=name, job_type="train",
            id=before["id"] if before else None, resume="allow" if before else None,
            tags=[str(derived.get("attention")), cfg.model.name, f"seq{cfg.seq_len}", *lg.tags],
            config=run_config(cfg, derived),
            dir=str(out_dir),  # offline runs land in <out_dir>/wandb/offline-run-*
            # console="off": Hydra's train.log keeps the console (uploaded at the end); silent: wandb's
            # own banner and closing summary (~35 lines a run) unless logger.quiet=false
            settings=wandb.Settings(console="off", silent=bool(lg.get("quiet", True))),
        )
        self.enabled = lg.mode != "disabled"  # disabled: wandb's no-op run, nothing written
        if not self.enabled:
            return
        atomic_write(out_dir / WANDB_RUN_FILE, json.dumps(
            {"id": self.run.id, "name": self.run.name, "group": group, "project": lg.project}) + "\n")
        self.run.define_metric(TOKENS)
        for pattern, summary in STEP_SUMMARIES.items():
            self.run.define_metric(pattern, step_metric=TOKENS, summary=summary)
        where = f"{lg.mode} run {self.run.name} (id {self.run.id}, group {group}"
        where += f", continuing after step {derived.get('start_step')})" if before else ")"
        if lg.mode == "offline":
            where += f"; publish with: wandb sync {Path(self.run.dir).parent}"
        log.info("wandb: %s", where)
        if cfg.resume and not before:
            log.info("wandb: no %s beside the resumed checkpoint: a new wandb run", WANDB_RUN_FILE)

    def log(self, step: int, row: dict[str, Any]) -> None:
        # commit now: a row left pending until finish() would land after the summary and replace it
        self.run.log(row, step=step, commit=True)

    def log_constants(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def finish(self, summary: dict[str, Any]) -> None:
        self._save_console_log()
        self.run.summary.update(summary)
        self.run.finish(exit_code=0 if summary.get("status") in ("ok", "stopped") else 1)

    def _save_console_log(self) -> None:
        """Copy Hydra's train.log into the run's files (uploaded by `wandb sync`); a copy, not wandb's
        symlink, so it survives moving the run folder before syncing."""
        source = self.out_dir / "train.log"
        if not self.enabled or not source.exists():
            return
        copy = Path(self.run.dir) / "train.log"
        shutil.copyfile(source, copy)
        self.run.save(str(copy), base_path=self.run.dir, policy="now")
