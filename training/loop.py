"""The training loop, built from small steps that tests call one by one.

train(cfg): validate -> data -> build_model -> wrap_model -> optimizer (-> resume) -> loop of
micro_batches/train_step (+ evaluate, save_checkpoint) -> summary. Under torchrun every rank runs
this same loop (training/distributed.py: process group, DDP/FSDP, reductions); each takes its own
rows of every batch, and only rank 0 logs and writes files.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from data import build_dataset
from model.attention import get_attention, naive_attention_bytes
from model.flops import MFU_CONVENTION, count_step_flops, flops_per_token, measure_matmul_flops, mfu
from model.gpt import GPT, GPTConfig
from training import distributed
from training.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    find_checkpoint,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from training.config import ConfigError, resolve_compile, resolve_device, resolve_dtype, validate_config
from training.distributed import DistInfo
from training.metrics import MetricsLogger, attention_label, run_name
from training.optim import build_optimizer, lr_at
from training.profiling import step_profiler

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Resuming with any of these changed would not continue the same run: the model's shape (seq_len
# sizes the position table) or the data each step reads. Everything else may change on resume:
# attention too, since naive, sdpa and flash compute the same function of the same weights (e.g.
# continue a naive run that ran out of memory with flash), and steps, lr, dtype, compile, device;
# grad_accum and the number of ranks too, since they only split each step's batch (micro_batches).
RESUME_MUST_MATCH = ("model", "seq_len", "batch_size", "seed", "data")
RESUME_MAY_DIFFER = ("data.num_proc", "data.connect_timeout_s")  # how tokens are made, not which


def build_model(cfg: DictConfig, tokenizer_vocab: int, device: torch.device) -> GPT:
    """GPT from the model group, seq_len and the attention group, on `device`, seeded by cfg.seed."""
    m = cfg.model
    vocab = m.vocab_size if m.vocab_size is not None else 64 * math.ceil(tokenizer_vocab / 64)
    if vocab < tokenizer_vocab:
        raise ConfigError(
            f"model.vocab_size={vocab} is smaller than the tokenizer's {tokenizer_vocab}; raise it or set null"
        )
    gcfg = GPTConfig(m.n_layer, m.n_head, m.n_embd, vocab, cfg.seq_len, m.dropout, m.bias)
    attention_options = {k: v for k, v in cfg.attention.items() if k != "name"}
    attend = get_attention(cfg.attention.name, **attention_options)
    torch.manual_seed(cfg.seed)
    return GPT(gcfg, attend).to(device)


def wrap_model(model: nn.Module, cfg: DictConfig, device: torch.device, dist: DistInfo = DistInfo()) -> nn.Module:
    """What the loop calls: the model, maybe compiled; under torchrun also DDP-wrapped or FSDP-sharded
    (FSDP shards `model` itself, so build the optimizer after this)."""
    compile = resolve_compile(cfg, device)
    if compile:
        log.info("compiling the model with torch.compile (the first steps are slow)")
        torch._dynamo.reset()  # in a -m sweep, drop the previous job's graphs (and its recompile budget)
    if dist.launched:
        return distributed.parallelize(model, cfg.parallel, device, compile)
    return torch.compile(model) if compile else model


def get_batch(
    ds: Any, split: str, batch_size: int, step: int, device: torch.device, rows: slice = slice(None)
) -> tuple[Tensor, Tensor]:
    """`rows` of batch number `step` of `split`, on device. Stateless: the same arguments give the same batch."""
    x, y = ds.sample_batch(split, batch_size, step)
    return _to_device(x[rows], device), _to_device(y[rows], device)


def micro_batches(
    ds: Any, batch_size: int, grad_accum: int, step: int, device: torch.device, dist: DistInfo = DistInfo()
) -> Iterator[tuple[Tensor, Tensor]]:
    """This rank's `grad_accum` micro-batches of optimizer step `step`.

    Every rank draws the step's whole batch (batch_size windows, a function of the seed and step)
    and keeps rows [r·s, (r+1)·s), s = batch_size / world_size, in grad_accum equal slices. So what
    a step trains on does not depend on the number of ranks or on grad_accum: one GPU and eight
    reach the same weights (up to float rounding), and a checkpoint resumes exactly on either.
    """
    x, y = ds.sample_batch("train", batch_size, step)
    share = batch_size // dist.world_size
    micro = share // grad_accum
    for i in range(grad_accum):
        rows = slice(dist.rank * share + i * micro, dist.rank * share + (i + 1) * micro)
        yield _to_device(x[rows], device), _to_device(y[rows], device)


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    if device.type == "cuda":  # pinned memory lets the copy overlap with compute
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterator[tuple[Tensor, Tensor]],
    grad_accum: int,
    lr: float,
    grad_clip: float,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> float:
    """One optimizer step over `grad_accum` micro-batches; returns their mean loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=next(model.parameters()).device)
    for i in range(grad_accum):
        x, y = next(micro_batches)
        # DDP averages gradients over ranks once, in the last micro-step's backward.
        with distributed.grad_sync(model, sync=i == grad_accum - 1):
            with autocast():
                _, loss = model(x, y)
            # Divide so the accumulated gradient is the mean over the whole batch.
            (loss / grad_accum).backward()
        total += loss.detach()
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


class NonFiniteStep(ArithmeticError):
    """NaN or Inf in a step's loss or gradients. Raised before optimizer.step(), with the gradients
    cleared: weights and optimizer state are still those of the step before."""

    def __init__(self, loss: float, grad_norm: float) -> None:
        super().__init__(f"loss {loss:.4g}, gradient norm {grad_norm:.4g}")
        self.loss, self.grad_norm = loss, grad_norm
        self.step: int | None = None  # the loop fills in which step (1-based)


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
) -> float:
    """Mean validation loss over the first `eval_steps` val batches (the same ones every time).

    Under torchrun each rank evaluates its share of every batch and the means are averaged: the
    same number as one process computes, in 1/world_size of the time.
    """
    model.eval()
    share = batch_size // dist.world_size
    rows = slice(dist.rank * share, (dist.rank + 1) * share)
    losses = []
    for i in range(eval_steps):
        x, y = get_batch(ds, "val", batch_size, i, device, rows)
        with autocast():
            losses.append(model(x, y)[1])
    model.train()
    return distributed.mean(torch.stack(losses).mean().item(), device)


@dataclass
class Run:
    """Everything the loop needs, built once by setup()."""

    cfg: DictConfig
    out_dir: Path
    device: torch.device
    ds: Any
    raw_model: GPT  # unwrapped (FSDP: sharded in place): what checkpoints store
    model: nn.Module  # what the loop calls (maybe compiled)
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager]
    start_step: int
    flops_per_token: float
    peak_flops: float | None
    derived: dict[str, Any] = field(default_factory=dict)
    dist: DistInfo = field(default_factory=DistInfo)  # this process's rank under torchrun


def setup(cfg: DictConfig) -> Run:
    """Validate, then build data, model, optimizer; restore a checkpoint when resuming."""
    dist = distributed.from_env()
    distributed.quiet_logging(dist)  # ranks > 0: warnings and errors only, tagged with the rank
    validate_config(cfg, dist.world_size)
    device = distributed.init(dist, resolve_device(cfg), cfg.dist_timeout_s)
    # Rank 0's run folder: the other ranks write nothing there, but read checkpoints from it.
    out_dir = Path(distributed.broadcast(str(cfg.out_dir)))
    dtype = resolve_dtype(cfg, device)
    cache_dir = Path(cfg.cache_dir)
    if not cache_dir.is_absolute():
        cache_dir = REPO_ROOT / cache_dir  # one cache wherever train.py is launched from
    try:
        ds = build_dataset(cfg.data, cfg.seq_len, cache_dir, cfg.seed)
    except ValueError as err:  # corpus too small, missing files...: the user's to fix
        raise ConfigError(f"data={cfg.data.name}: {err}") from err
    model = build_model(cfg, ds.vocab_size, device)
    wrapped = wrap_model(model, cfg, device, dist)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), device)
    start_step = _resume(cfg, out_dir, model, optimizer) if cfg.resume else 0
    n_params = model.num_params()
    fpt = flops_per_token(model.cfg, n_params)
    peak, peak_source = _peak_flops(cfg, device, dtype)
    if peak and dist.world_size > 1:  # tokens/s counts every rank's tokens: MFU against all their devices
        peak, peak_source = peak * dist.world_size, f"{peak_source} × {dist.world_size} ranks"
    autocast = lambda: torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)  # noqa: E731
    derived = {
        "params": n_params, "params_total": model.num_params(non_embedding=False),
        "vocab_size": model.cfg.vocab_size, "tokenizer_vocab": ds.vocab_size,
        "tokens_per_step": cfg.batch_size * cfg.seq_len, "ranks": dist.world_size,
        "parallel": cfg.parallel if dist.launched else "none",
        "micro_batch": cfg.batch_size // (cfg.grad_accum * dist.world_size),  # per rank
        "flops_per_token": fpt, "mfu_convention": MFU_CONVENTION,
        "peak_flops": peak, "peak_flops_source": peak_source,
        "attention": attention_label(cfg), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "compile": resolve_compile(cfg, device),
        "torch": torch.__version__, "start_step": start_step,
    }
    return Run(cfg, out_dir, device, ds, model, wrapped, optimizer, autocast, start_step, fpt, peak, derived, dist)


def _resume(cfg: DictConfig, out_dir: Path, model: GPT, optimizer: torch.optim.Optimizer) -> int:
    try:
        path = find_checkpoint(cfg.resume, out_dir)
        state = load_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as err:
        raise ConfigError(str(err) if isinstance(err, FileNotFoundError) else f"resume: {err}") from err
    saved, current = state["config"], OmegaConf.to_container(cfg, resolve=True)
    differ = [
        f"{key} differs from the checkpoint's ({now!r} vs saved {then!r})"
        for key, now, then in _differences(current, saved, RESUME_MUST_MATCH)
        if key not in RESUME_MAY_DIFFER
    ]
    if differ:
        raise ConfigError(
            f"resume: {'; '.join(differ)}. Keep these as saved in {path} to continue that run, or start a new run"
        )
    if saved.get("attention") != current.get("attention"):
        before, now = saved.get("attention"), current.get("attention")
        log.info("resume: attention %s -> %s (the same weights serve every attention)", before, now)
    try:
        step = restore_checkpoint(state, model, optimizer)
    except CheckpointError as err:
        raise ConfigError(f"resume: {path}: {err}") from err
    log.info("resumed from %s after step %d", path, step)
    return step


def _differences(a: Any, b: Any, keys: tuple[str, ...], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, a's value, b's value) for every leaf under `keys` where two config dicts differ."""
    found = []
    for key in keys:
        x = a.get(key) if isinstance(a, dict) else None
        y = b.get(key) if isinstance(b, dict) else None
        if isinstance(x, dict) and isinstance(y, dict):
            found += _differences(x, y, tuple(sorted(x.keys() | y.keys())), f"{prefix}{key}.")
        elif x != y:
            found.append((f"{prefix}{key}", x, y))
    return found


def _peak_flops(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """The MFU denominator: configured, else measured on CUDA, else none (CPU: no MFU)."""
    if cfg.peak_tflops is not None:
        return cfg.peak_tflops * 1e12, "config peak_tflops"
    if device.type == "cuda":
        return measure_matmul_flops(device, dtype), f"measured {dtype} 4096^3 matmul"
    return None, "none (CPU: set peak_tflops for an MFU)"


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train as configured; return the summary (status "ok" or "oom"). Config errors raise ConfigError."""
    run = setup(cfg)
    log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
    log.info("derived: %s", ", ".join(f"{k}={v}" for k, v in run.derived.items()))
    metrics = MetricsLogger(cfg, run.out_dir, run.derived) if run.dist.is_main else distributed.NoMetrics()
    _log_step_flops(run, metrics)
    summary: dict[str, Any] = {"status": "ok"}
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
        a = cfg.attention.name
        log.error("%s", oom_message(cfg, run.derived["micro_batch"], resolve_dtype(cfg, run.device), run.device))
        error = f"CUDA out of memory (attention={a}, seq_len={cfg.seq_len}, batch_size={cfg.batch_size})"
        summary.update(status="oom", error=error)
    except BaseException as err:  # still close the logs, marked as failed, then let it propagate
        summary.update(status="error", error=repr(err))
        raise
    finally:
        metrics.finish(summary)
        shown = ", ".join(f"{k}={_short(v)}" for k, v in summary.items())
        log.info("summary: %s | run folder %s", shown, run.out_dir)
    if run.device.type == "cuda":  # a -m sweep's next job (e.g. after an OOM) starts with this one's memory free
        del run
        gc.collect()
        torch.cuda.empty_cache()
    return summary


def oom_message(cfg: DictConfig, micro_batch: int, dtype: torch.dtype, device: torch.device) -> str:
    """What a run that ran out of GPU memory tells its user: its shape, for naive attention the
    memory of its N×N matrices (model.attention.naive_attention_bytes), and what to change."""
    a, m, n = cfg.attention.name, cfg.model, cfg.seq_len
    text = f"out of GPU memory: attention={a} model={m.name} seq_len={n} batch_size={cfg.batch_size}"
    text += f" (micro-batch {micro_batch})."
    if a == "naive":
        one, kept = naive_attention_bytes(micro_batch, m.n_head, n, m.n_layer, dtype, device.type)
        text += (
            f" Naive attention makes micro-batch×heads×N×N = {micro_batch}×{m.n_head}×{n}² scores: "
            f"{_size(one)} per matrix in {str(dtype).removeprefix('torch.')}, and the backward needs "
            f"{_size(kept)} of them kept over {m.n_layer} layers"
        )
        if device.type == "cuda":
            text += f" (this GPU has {_size(torch.cuda.get_device_properties(device).total_memory)})"
        text += "."
    if a != "flash":
        return text + " Try attention=flash (no N×N matrices), a smaller batch_size, or a larger grad_accum."
    return text + " Try a smaller batch_size or a larger grad_accum (the same tokens per step, fewer at once)."


def _size(n_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= scale / 2:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes / 2**10:.1f} KiB"


def _loop(run: Run, metrics: MetricsLogger) -> dict[str, Any]:
    cfg, device = run.cfg, run.device
    end = cfg.stop_at or cfg.steps
    eval_batch = cfg.batch_size // cfg.grad_accum  # what one process would evaluate at a time; ranks split it
    times: list[float] = []
    recent: list[float] = []  # train losses since the last console line
    done = run.start_step
    skipped = 0  # steps whose NaN/Inf batch was skipped (skip_nonfinite_steps)
    summary: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # peaks are this run's, not an earlier sweep job's
    # disable=None: a bar on terminals only; logs and CI get the log_every lines instead.
    quiet = None if run.dist.is_main else True  # only rank 0 draws a bar
    bar = tqdm(range(run.start_step, end), initial=run.start_step, total=end, desc=run_name(cfg), disable=quiet)
    profiled: dict[str, Any] = {}  # profile=true: filled with the attention share after the profiled steps
    with logging_redirect_tqdm(), step_profiler(cfg, run.out_dir, profiled, run.dist.is_main) as prof, \
            stop_on_signals() as signals:
        for step in bar:
            t0 = time.perf_counter()
            # The data position is a function of the step alone (and this rank's rows).
            batches = micro_batches(run.ds, cfg.batch_size, cfg.grad_accum, step, device, run.dist)
            lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
            try:
                loss = train_step(run.model, run.optimizer, batches, cfg.grad_accum, lr, cfg.grad_clip, run.autocast)
            except NonFiniteStep as bad:
                bad.step = step + 1
                if not cfg.skip_nonfinite_steps:
                    raise  # train() reports it; no checkpoint is written from here on
                skipped += 1
                log.warning("step %d: %s: batch skipped, weights unchanged (skip_nonfinite_steps=true; %d skipped "
                            "so far)", bad.step, bad, skipped)
                loss = bad.loss
            loss = distributed.mean(loss, device)  # every rank's share of the batch
            dt = distributed.maximum(time.perf_counter() - t0, device)  # the slowest rank's step
            times.append(dt)
            row = _step_metrics(run, loss, lr, dt)
            done = step + 1
            if skipped:
                row["train/skipped_steps"] = skipped
            if (cfg.eval_every and done % cfg.eval_every == 0) or done == end:
                val = evaluate(run.model, run.ds, cfg.eval_steps, eval_batch, device, run.autocast, run.dist)
                row["val/loss"] = val
                summary["final/val_loss"] = row["val/loss"]
            metrics.log(done, row)
            recent.append(loss)
            bar.set_postfix_str(_postfix(row), refresh=False)
            if done % cfg.log_every == 0 or done in (run.start_step + 1, end) or "val/loss" in row:
                # Console lines show the loss averaged since the previous line: one batch is noisy.
                finite = [x for x in recent if math.isfinite(x)] or recent  # a skipped step's NaN hides nothing
                averaged = {**row, "train/loss": sum(finite) / len(finite)}
                log.info("step %d/%d | %s", done, cfg.steps, _postfix(averaged))
                recent.clear()
            stop = distributed.maximum(float(bool(signals)), device) > 0 and done < end  # any rank's signal stops all
            if cfg.ckpt_every and (done % cfg.ckpt_every == 0 or done == end or stop):
                config = OmegaConf.to_container(cfg, resolve=True)
                save_checkpoint(run.out_dir / CHECKPOINT_NAME, run.raw_model, run.optimizer, done, config)
            if prof is not None:
                prof.step()
            if stop:
                # A rank may stop on another rank's signal before its own arrives (torchrun sends SIGTERM to all).
                name = signals[0] if signals else "SIGTERM"
                saved = f"checkpoint saved in {run.out_dir}" if cfg.ckpt_every else "no checkpoint (ckpt_every=0)"
                log.warning("%s: stopped after step %d; %s. Continue with resume=%s", name, done, saved, run.out_dir)
                summary.update(status="interrupted", signal=name)
                break
    summary["final/train_loss"] = loss if times else None
    summary["steps_done"] = done
    if skipped:
        summary["skipped_steps"] = skipped
    if times:
        steady = statistics.median(times[1:] or times)  # step 1 pays for compilation and warm-up
        summary["perf/step_ms"] = 1e3 * steady
        summary["perf/tokens_per_s"] = cfg.batch_size * cfg.seq_len / steady
        if run.peak_flops:
            summary["perf/mfu"] = mfu(summary["perf/tokens_per_s"], run.flops_per_token, run.peak_flops)
        if device.type == "cuda":  # the fullest GPU's peak: ranks can differ (FSDP's root, rank 0's extras)
            summary["perf/peak_mem_gib"] = distributed.maximum(torch.cuda.max_memory_allocated(device) / 2**30, device)
    if profiled.get("attention_share") is not None:
        summary["profile/attention_share"] = profiled["attention_share"]
        summary["profile/attention_ms"] = profiled["attention_ms"]
    summary["ranks"] = run.dist.world_size  # tokens/s above counts all ranks' tokens
    return summary


def _log_step_flops(run: Run, metrics: MetricsLogger) -> None:
    """FLOPs of one optimizer step split into model/attention and forward/backward, counted by
    FlopCounterMode on a shapes-only copy of the model, so the backward's recomputation shows."""
    flops = count_step_flops(run.raw_model.cfg, run.raw_model.blocks[0].attn.attend, run.cfg.batch_size)
    metrics.log(run.start_step, flops)
    log.info(
        "FLOPs per step: model fwd %.3g bwd %.3g | attention fwd %.3g bwd %.3g (analytic %.3g / %.3g), "
        "recompute %.3g = %.1f%% of the step",
        flops["flops/model_fwd"], flops["flops/model_bwd"], flops["flops/attn_fwd"], flops["flops/attn_bwd"],
        flops["flops/attn_fwd_analytic"], flops["flops/attn_bwd_analytic"], flops["flops/attn_recompute"],
        100 * flops["flops/attn_recompute_share"],
    )


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[str]]:
    """While training, SIGTERM (a scheduler's stop, `kill`) and SIGINT (Ctrl-C) are noted in the
    list this yields instead of ending the process: the loop finishes its step, saves a checkpoint
    and returns. A second signal acts as it would have (Ctrl-C twice stops at once). Outside the
    main thread, where Python cannot catch signals, this does nothing."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.getsignal(s) or signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)  # logged by the loop: handlers should do little
        signal.signal(signum, previous[signum])

    for s in previous:
        signal.signal(s, note)
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _step_metrics(run: Run, loss: float, lr: float, dt: float) -> dict[str, float]:
    tokens_per_s = run.cfg.batch_size * run.cfg.seq_len / dt
    row = {"train/loss": loss, "lr": lr, "perf/step_ms": 1e3 * dt, "perf/tokens_per_s": tokens_per_s}
    if run.peak_flops:
        row["perf/mfu"] = mfu(tokens_per_s, run.flops_per_token, run.peak_flops)
    if run.device.type == "cuda":  # the run's peak so far: weights, optimizer state, activations
        row["perf/peak_mem_gib"] = torch.cuda.max_memory_allocated(run.device) / 2**30
    return row


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _postfix(row: dict[str, float]) -> str:
    parts = [f"loss {row['train/loss']:.4f}"]
    if "val/loss" in row:
        parts.append(f"val {row['val/loss']:.4f}")
    parts += [f"lr {row['lr']:.2e}", f"{row['perf/step_ms']:.0f} ms", f"{row['perf/tokens_per_s']:,.0f} tok/s"]
    if "perf/mfu" in row:
        parts.append(f"mfu {100 * row['perf/mfu']:.1f}%")
    if "perf/peak_mem_gib" in row:
        parts.append(f"mem {row['perf/peak_mem_gib']:.1f} GiB")
    return " | ".join(parts)
