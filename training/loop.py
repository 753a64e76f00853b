"""The training loop, built from small steps that tests call one by one.

train(cfg): setup (training/setup.py: validate -> data -> build_model -> wrap_model -> optimizer
(-> resume)) -> a loop of micro_batches/train_step (+ evaluate, save_checkpoint) -> summary.
Under torchrun every rank runs this same loop (training/distributed.py: process group, DDP/FSDP,
reductions); each takes its own rows of every batch, and only rank 0 logs and writes files.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from data.files import atomic_write
from model.flops import count_step_flops, mfu
from training import distributed
from training.batches import BatchInputs, get_batch, micro_batches, no_inputs
from training.checkpoint import CHECKPOINT_NAME, save_checkpoint
from training.config import resolve_dtype
from training.console import oom_message, short, start_banner, step_line
from training.context_parallel import Shard, whole_sequences
from training.distributed import DistInfo
from training.metrics import MetricsLogger, NoMetrics, run_name
from training.optim import lr_at
from training.profiling import TRAIN_STEP, profiler_recording, step_profiler
from training.progress import ANNOUNCE_ABOVE_S, StepProgress
from training.setup import Run, setup
from training.signals import StopNow, stop_on_signals

log = logging.getLogger(__name__)

RESOLVED_CONFIG = "resolved_config.yaml"  # in the run folder: the config with batch_size, out_dir, ... resolved, and `derived`


class NonFiniteStep(ArithmeticError):
    """NaN or Inf in a step's loss or gradients. Raised before optimizer.step(), with the gradients
    cleared: weights and optimizer state are still those of the step before."""

    def __init__(self, loss: float, grad_norm: float) -> None:
        super().__init__(f"loss {loss:.4g}, gradient norm {grad_norm:.4g}")
        self.loss, self.grad_norm = loss, grad_norm
        self.step: int | None = None  # the loop fills in which step (1-based)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterator[tuple[Tensor, Tensor]],
    grad_accum: int,
    lr: float,
    grad_clip: float,
    autocast: Callable[[], contextlib.AbstractContextManager],
    shard: Shard = whole_sequences,
    inputs: BatchInputs = no_inputs,
    phase: Callable[[str], None] = lambda text: None,
) -> float:
    """One optimizer step over `grad_accum` micro-batches; returns their mean loss. `shard` gives each
    micro-batch's tokens to this rank (context parallelism: its share of every sequence); `inputs`
    the model's extra inputs for a batch (document ids, positions: training.batches.document_inputs).
    `phase` is told what the step starts doing next (training/progress.py reports it while a step runs long)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=next(model.parameters()).device)
    for i in range(grad_accum):
        x, y = next(micro_batches)
        # DDP averages gradients over ranks once, in the last micro-step's backward.
        with distributed.grad_sync(model, sync=i == grad_accum - 1), shard(x, y) as (x, y, positions):
            phase(f"micro-batch {i + 1}/{grad_accum} forward")
            with autocast():
                _, loss = model(x, y, **{"positions": positions, **inputs(x)})
            phase(f"micro-batch {i + 1}/{grad_accum} backward")
            # Divide so the accumulated gradient is the mean over the whole batch.
            (loss / grad_accum).backward()
        total += loss.detach()
    phase("optimizer step")
    norm = _grad_norm(model, grad_clip)
    # Decide before optimizer.step(), which would spread a NaN into every weight and moment; this
    # costs one GPU sync. The norm is of the gradients every rank shares (DDP averages them, FSDP
    # reduces over shards), so under torchrun all ranks decide alike, and a NaN loss on any rank
    # makes them non-finite too.
    if not torch.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteStep(total.item() / grad_accum, norm.item())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total.item() / grad_accum  # .item() waits for the GPU, so step timings are real


def _grad_norm(model: nn.Module, grad_clip: float) -> Tensor:
    """The global gradient norm, clipping to `grad_clip` when it is > 0."""
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    return norm.full_tensor() if isinstance(norm, DTensor) else norm  # FSDP: reduced over the shards


@torch.no_grad()
def evaluate(
    model: nn.Module, ds: Any, eval_steps: int, batch_size: int, device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager], dist: DistInfo = DistInfo(),
    shard: Shard = whole_sequences,
    inputs: BatchInputs = no_inputs,
) -> float:
    """Mean validation loss over the first `eval_steps` val batches (the same ones every time).

    Under torchrun each rank evaluates its share of every batch (its rows; with context
    parallelism, its tokens of them) and the means are averaged: the same number as one process
    computes, in 1/world_size of the time.
    """
    model.eval()
    share = batch_size // dist.dp_size
    rows = slice(dist.dp_rank * share, (dist.dp_rank + 1) * share)
    losses = []
    for i in range(eval_steps):
        x, y = get_batch(ds, "val", batch_size, i, device, rows)
        with shard(x, y) as (x, y, positions), autocast():
            losses.append(model(x, y, **{"positions": positions, **inputs(x)})[1])
    model.train()
    return distributed.mean(torch.stack(losses).mean().item(), device)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train as configured; return the summary (status "ok", "stopped" (stop_at), "interrupted" (signals), "oom"
    or "nonfinite").
    Config errors raise ConfigError."""
    run = setup(cfg)
    for line in start_banner(run):
        log.info("%s", line)
    if run.dist.is_main:  # the whole config as this run resolved it, and the numbers derived from it
        derived = {k: str(v) if isinstance(v, str) else v for k, v in run.derived.items()}  # torch.__version__ is a str subclass
        resolved = {"config": OmegaConf.to_container(cfg, resolve=True), "derived": derived}
        run.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run.out_dir / RESOLVED_CONFIG, OmegaConf.to_yaml(OmegaConf.create(resolved)))
    metrics = MetricsLogger(cfg, run.out_dir, run.derived) if run.dist.is_main else NoMetrics()
    _log_step_flops(run, metrics)
    # Known before the first step, so an out-of-memory summary has them too: whether the backward
    # reruns the blocks, and what training/memory.py expected the step to need.
    summary: dict[str, Any] = {"status": "ok", "checkpointing": run.derived["checkpointing"],
                               "loss_chunk": cfg.loss_chunk, "memory/estimated_gib": run.derived["estimated_step_gib"]}
    try:
        summary.update(_loop(run, metrics))
    except NonFiniteStep as bad:
        checkpoint = run.out_dir / CHECKPOINT_NAME
        kept = f"the last checkpoint, {checkpoint}, is kept as it was" if checkpoint.exists() else "no checkpoint yet"
        log.error(
            "step %d: %s. Stopped before the optimizer step, so no weight was changed by it; %s. Lower lr, raise "
            "warmup_steps, set grad_clip or dtype=fp32, or set skip_nonfinite_steps=true to skip such batches.",
            bad.step, bad, kept,
        )
        summary.update(status="nonfinite", error=f"step {bad.step}: {bad}")
    except torch.OutOfMemoryError:
        dtype = resolve_dtype(cfg, run.device)
        log.error("%s", oom_message(cfg, run.derived["micro_batch"], dtype, run.device, run.raw_model.checkpointing))
        error = f"CUDA out of memory (attention={cfg.attention.name}, seq_len={cfg.seq_len}, batch_size={cfg.batch_size})"
        summary.update(status="oom", error=error)
    except BaseException as err:  # still close the logs, marked as failed, then let it propagate
        summary.update(status="error", error=repr(err))
        raise
    finally:
        metrics.finish(summary)
        shown = ", ".join(f"{k}={short(v)}" for k, v in summary.items())
        log.info("summary: %s | run folder %s", shown, run.out_dir)
    if run.device.type == "cuda":  # a -m sweep's next job (e.g. after an OOM) starts with this one's memory free
        del run
        gc.collect()
        torch.cuda.empty_cache()
    return summary


@dataclass
class _Tally:
    """What the loop accumulates over its steps, for the console lines and the summary."""

    done: int  # optimizer steps done, counting those before a resume
    times: list[float] = field(default_factory=list)  # this process's step times, seconds
    traced: list[bool] = field(default_factory=list)  # per step of `times`: did profile=true's profiler record it?
    recent: list[float] = field(default_factory=list)  # train losses since the last console line
    skipped: int = 0  # steps whose NaN/Inf batch was skipped (skip_nonfinite_steps)
    loss: float | None = None  # the last step's train loss
    val: tuple[int, float] | None = None  # (step, val loss) of the last evaluation


def _loop(run: Run, metrics: MetricsLogger | NoMetrics) -> dict[str, Any]:
    cfg = run.cfg
    end = cfg.stop_at or cfg.steps
    tally, summary = _Tally(done=run.start_step), {}
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)  # peaks are this run's, not an earlier sweep job's
    # disable=None: a bar on terminals only; logs and CI get the log_every lines instead. Rank 0 alone draws one.
    bar = tqdm(range(run.start_step, end), initial=run.start_step, total=end, desc=run_name(cfg),
               disable=None if run.dist.is_main else True)
    profiled: dict[str, Any] = {}  # profile=true: filled with the attention share after the profiled steps
    estimate = run.estimate.total_s if run.estimate else None
    compiling = run.derived["compile"]
    with logging_redirect_tqdm(), step_profiler(cfg, run.out_dir, profiled, run.dist.is_main) as prof, \
            stop_on_signals() as signals, StepProgress(estimate, enabled=run.dist.is_main) as progress:
        try:
            for step in bar:
                # This process's first step is the one that compiles: say what it does while it does it.
                first = step == run.start_step and (compiling or (estimate or 0) > ANNOUNCE_ABOVE_S)
                progress.begin(step + 1, announce=first, note="torch.compile compiles the model in it" if compiling else "")
                with torch.profiler.record_function(TRAIN_STEP) if prof is not None else contextlib.nullcontext():
                    # the span profile=true measures attention against; the profiler's action for this
                    # step holds until prof.step() below, so whether it traces the step is known now
                    row = _step(run, step, tally, progress.phase, traced=profiler_recording(prof))
                progress.end()
                # stop_at adds no evaluation: stopping and resuming logs what one straight run logs.
                if (cfg.eval_every and tally.done % cfg.eval_every == 0) or tally.done == cfg.steps:
                    eval_batch = cfg.batch_size // cfg.grad_accum  # what one process would evaluate at a time; ranks split it
                    row["val/loss"] = evaluate(run.model, run.ds, cfg.eval_steps, eval_batch, run.device, run.autocast,
                                               run.dist, run.shard, run.inputs)
                    tally.val = (tally.done, row["val/loss"])
                metrics.log(tally.done, row)
                bar.set_postfix_str(step_line(row), refresh=False)
                _console_line(run, tally, row, end)
                # Any rank's signal stops all (torchrun sends SIGTERM to every rank).
                stop = distributed.maximum(float(bool(signals)), run.device) > 0 and tally.done < end
                if cfg.ckpt_every and (tally.done % cfg.ckpt_every == 0 or tally.done == end or stop):
                    config = OmegaConf.to_container(cfg, resolve=True)
                    save_checkpoint(run.out_dir / CHECKPOINT_NAME, run.raw_model, run.optimizer, tally.done, config)
                if prof is not None:
                    prof.step()
                if stop:
                    summary.update(_stopped(run, tally.done, signals[0] if signals else "SIGTERM"))
                    break
            else:
                if end < cfg.steps:
                    summary.update(_stopped(run, tally.done))
        except StopNow as again:  # a second signal: leave the step as it is; the checkpoint on disk is whole
            summary.update(_stopped(run, tally.done, again.signal_name, now=True))
    if tally.val is not None and tally.val[0] == tally.done:  # a val loss from an earlier step is not final
        summary["final/val_loss"] = tally.val[1]
    return {**summary, **_final_numbers(run, tally, profiled)}


def _step(run: Run, step: int, tally: _Tally, phase: Callable[[str], None] = lambda text: None,
          traced: bool = False) -> dict[str, float]:
    """Optimizer step number `step` (0-based), timed and averaged over ranks; returns its metrics row.
    traced: the profiler records this step (its time then stays out of the summary's median)."""
    cfg, device = run.cfg, run.device
    t0 = time.perf_counter()
    # The data position is a function of the step alone (and this rank's rows).
    batches = micro_batches(run.ds, cfg.batch_size, cfg.grad_accum, step, device, run.dist)
    lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
    try:
        loss = train_step(run.model, run.optimizer, batches, cfg.grad_accum, lr, cfg.grad_clip, run.autocast, run.shard,
                          run.inputs, phase)
    except NonFiniteStep as bad:
        bad.step = step + 1
        if not cfg.skip_nonfinite_steps:
            raise  # train() reports it; no checkpoint is written from here on
        tally.skipped += 1
        log.warning("step %d: %s: batch skipped, weights unchanged (skip_nonfinite_steps=true; %d skipped so far)",
                    bad.step, bad, tally.skipped)
        loss = bad.loss
    loss = distributed.mean(loss, device)  # every rank's share of the batch
    dt = distributed.maximum(time.perf_counter() - t0, device)  # the slowest rank's step
    tally.done, tally.loss = step + 1, loss
    tally.times.append(dt)
    tally.traced.append(traced)
    tally.recent.append(loss)
    row = _step_metrics(run, loss, lr, dt)
    if tally.skipped:
        row["train/skipped_steps"] = tally.skipped
    return row


def _step_metrics(run: Run, loss: float, lr: float, dt: float) -> dict[str, float]:
    tokens_per_s = run.cfg.batch_size * run.cfg.seq_len / dt
    row = {"train/loss": loss, "lr": lr, "perf/step_ms": 1e3 * dt, "perf/tokens_per_s": tokens_per_s}
    if run.peak_flops:
        row["perf/mfu"] = mfu(tokens_per_s, run.flops_per_token, run.peak_flops)
        row["perf/hfu"] = mfu(tokens_per_s, run.hardware_flops_per_token, run.peak_flops)  # recompute included
    if run.device.type == "cuda":  # the run's peak so far: weights, optimizer state, activations
        row["perf/peak_mem_gib"] = torch.cuda.max_memory_allocated(run.device) / 2**30
    return row


def _console_line(run: Run, tally: _Tally, row: dict[str, float], end: int) -> None:
    """Every log_every steps (and the first, the last, and each evaluation) a console line with
    the loss averaged since the previous line: one batch is noisy."""
    if tally.done % run.cfg.log_every == 0 or tally.done in (run.start_step + 1, end) or "val/loss" in row:
        finite = [x for x in tally.recent if math.isfinite(x)] or tally.recent  # a skipped step's NaN hides nothing
        log.info("step %d/%d | %s", tally.done, run.cfg.steps, step_line({**row, "train/loss": sum(finite) / len(finite)}))
        tally.recent.clear()


def _stopped(run: Run, done: int, signal_name: str | None = None, now: bool = False) -> dict[str, Any]:
    """Log why the run ends before `steps` and how to continue it; the summary's status and signal."""
    why = f"{signal_name}: stopped" if signal_name else f"stop_at={run.cfg.stop_at}: stopped"
    where = f"during step {done + 1}" if now else f"after step {done}"
    checkpoint = run.out_dir / CHECKPOINT_NAME
    if not run.cfg.ckpt_every:
        saved = "no checkpoint (ckpt_every=0)"
    elif not checkpoint.exists():
        saved = "no checkpoint yet"
    else:
        saved = f"the last checkpoint ({checkpoint}) is kept as it was" if now else f"checkpoint saved in {run.out_dir}"
    more = "" if signal_name else " stop_at=null (or a later step)"
    resume = f". Continue with resume={run.out_dir}{more}" if checkpoint.exists() else ""
    log.warning("%s %s; %s%s", why, where, saved, resume)
    return {"status": "interrupted", "signal": signal_name} if signal_name else {"status": "stopped"}


def steady_step_time(times: list[float], traced: list[bool]) -> float:
    """The median step time in seconds, without the first step (it pays for compilation and
    warm-up) and without the steps profile=true's profiler recorded (its tracing slows them) as
    long as another step is left; the first step only when it is the only one."""
    later = list(zip(times, traced))[1:]
    untraced = [t for t, was_traced in later if not was_traced]
    return statistics.median(untraced or [t for t, _ in later] or times)


def _final_numbers(run: Run, tally: _Tally, profiled: dict[str, Any]) -> dict[str, Any]:
    """The summary's losses, steady-state speed, MFU, memory and attention share."""
    cfg, device = run.cfg, run.device
    summary: dict[str, Any] = {"steps_done": tally.done}
    if tally.loss is not None:  # None: stopped before a step of this process ended
        summary["final/train_loss"] = tally.loss
    if tally.skipped:
        summary["skipped_steps"] = tally.skipped
    if tally.times:
        steady = steady_step_time(tally.times, tally.traced)
        # final/*: named apart from the per-step perf/* values (training/metrics.py)
        summary["final/step_ms_median"] = 1e3 * steady
        summary["final/tokens_per_s_median"] = cfg.batch_size * cfg.seq_len / steady
        if run.peak_flops:
            summary["final/mfu_median"] = mfu(summary["final/tokens_per_s_median"], run.flops_per_token, run.peak_flops)
            summary["final/hfu_median"] = mfu(summary["final/tokens_per_s_median"], run.hardware_flops_per_token, run.peak_flops)
        if device.type == "cuda":  # the fullest GPU's peak: ranks can differ (FSDP's root, rank 0's extras)
            summary["final/peak_mem_gib"] = distributed.maximum(torch.cuda.max_memory_allocated(device) / 2**30, device)
    if profiled.get("attention_share") is not None:
        summary["profile/attention_share"] = profiled["attention_share"]
        summary["profile/attention_ms"] = profiled["attention_ms"]
    summary["ranks"] = run.dist.world_size  # tokens/s above counts all ranks' tokens
    return summary


def _log_step_flops(run: Run, metrics: MetricsLogger | NoMetrics) -> None:
    """FLOPs of one optimizer step split into model/attention and forward/backward, counted by
    FlopCounterMode on a shapes-only copy of the model, so the backward's recomputation shows."""
    attend = run.cp.local_attend if run.cp else run.raw_model.blocks[0].attn.attend  # the whole step as on one process
    model = run.raw_model
    flops = count_step_flops(model.cfg, attend, run.cfg.batch_size, model.checkpointing, model.loss_chunk)
    metrics.log_constants(run.start_step, flops)
    log.info(
        "FLOPs per step: model fwd %.3g bwd %.3g | attention executed fwd %.3g bwd %.3g (algorithmic %.3g / %.3g), "
        "recompute %.3g = %.1f%% of the step",
        flops["flops/model_fwd"], flops["flops/model_bwd"], flops["flops/attn_fwd_executed"],
        flops["flops/attn_bwd_executed"], flops["flops/attn_fwd_algorithmic"], flops["flops/attn_bwd_algorithmic"],
        flops["flops/attn_recompute"],
        100 * flops["flops/attn_recompute_share"],
    )
