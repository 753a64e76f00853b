"""Checkpoints that resume a run exactly: model, optimizer, step (which fixes both the lr schedule
and the data position, since batches are a pure function of the step) and the RNG states; and the
rules for resuming (which config fields must match the checkpoint's).

One torch.save file, not safetensors: safetensors would hold the weights only, leaving optimizer
state, RNG and config in a pickle that torch.load must still vet, and it has no checksum, where
torch's zip format carries a CRC32 per tensor that catches a flipped bit.
"""

from __future__ import annotations

import logging
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch import nn

from data.files import atomic_path
from training.config import ConfigError
from training.distributed import full_state, load_full_state

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_KEYS = ("model", "optimizer", "step", "rng", "config")
# Resuming with any of these changed would not continue the same run: the model's shape (seq_len
# sizes the position table) or the data each step reads. Everything else may change on resume:
# attention too, since naive, sdpa and flash compute the same function of the same weights (e.g.
# continue a naive run that ran out of memory with flash), and steps, lr, dtype, compile, device;
# grad_accum and the number of ranks too, since they only split each step's batch (micro_batches).
RESUME_MUST_MATCH = ("model", "seq_len", "batch_size", "seed", "data")
RESUME_MAY_DIFFER = ("data.num_proc", "data.connect_timeout_s")  # how tokens are made, not which


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: damaged, foreign, unsafe or not fitting the model. The
    message names the file."""


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, config: dict[str, Any]
) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact.

    `model` must be the unwrapped module (not torch.compile'd or DDP-wrapped), so the keys
    carry no `_orig_mod.`/`module.` prefixes. `step` is the number of optimizer steps done.
    Under torchrun, call it on every rank (an FSDP model is gathered from all of them); rank 0
    writes the full tensors, in the same layout as a single process, so any world size loads it.
    """
    weights, optimizer_state = full_state(model, optimizer)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    poisoned = [name for name, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if poisoned:  # the loop never steps on NaN/Inf gradients, so this is a bug: keep the last good file
        raise CheckpointError(f"not writing {path}: NaN/Inf in the weights {poisoned[:3]}; the last checkpoint is kept")
    state = {
        "model": weights,
        "optimizer": optimizer_state,
        "step": step,
        "rng": _rng_state(),
        "config": config,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # half files of writers killed mid-save (GBs each)
        stale.unlink(missing_ok=True)


def find_checkpoint(resume: bool | str, out_dir: Path) -> Path:
    """Where `resume=...` points: true -> <out_dir>/checkpoint.pt; a run folder or a .pt path otherwise."""
    path = out_dir if resume is True else Path(str(resume))
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"resume={resume!r}: no checkpoint at {path}; pass resume=<run folder or checkpoint.pt> "
            "or hydra.run.dir=<the run folder> with resume=true"
        )
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The saved state (model, optimizer, step, rng, config), on CPU. Nothing is restored yet.

    Raises CheckpointError naming the file when it is damaged (truncated, bits changed), holds
    pickled objects other than tensors and plain containers, or was not written by save_checkpoint.
    """
    damaged = f"checkpoint {path} is damaged or is not a file written by train.py"
    remedy = "resume from another copy, or start a new run without resume"
    try:
        # torch.load checks no CRC: a flipped bit in a tensor would load as a silently wrong weight.
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError) as err:  # truncated, empty, text, ...
        raise CheckpointError(f"{damaged} ({err}); {remedy}") from err
    if bad is not None:
        raise CheckpointError(f"{damaged}: {bad} fails its CRC32 check (changed on disk or in a copy); {remedy}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # weights_only: no pickled code runs
    except pickle.UnpicklingError as err:  # what weights_only refuses: arbitrary objects, maybe code
        what = ", ".join(f"GLOBAL {name}" for name in _unsafe_globals(path)) or "refused by weights_only"
        raise CheckpointError(
            f"checkpoint {path} holds pickled objects other than tensors and containers ({what}); it was not "
            f"written by train.py and is not loaded, since unpickling it could run code; {remedy}"
        ) from err
    except (RuntimeError, EOFError, KeyError, ValueError) as err:
        raise CheckpointError(f"{damaged} ({type(err).__name__}: {str(err)[:200]}); {remedy}") from err
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointError(
            f"{path} is not a checkpoint written by train.py: it has no {', '.join(missing)} "
            f"(a bare state_dict or another program's file?); {remedy}"
        )
    return state


def _unsafe_globals(path: Path) -> list[str]:
    """The classes and functions the pickle names beyond what weights_only allows (read, never run)."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # the file is refused either way; the list only makes the message better
        return []


def restore_checkpoint(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Put model, optimizer and RNG back as saved; return the number of steps done."""
    try:
        load_full_state(model, optimizer, state["model"], state["optimizer"])  # FSDP: each rank keeps its shard
    except (RuntimeError, ValueError, KeyError) as err:  # shapes or parameter groups differ
        detail = " ".join(str(err).split())[:300]  # torch lists every tensor on its own line; one line will do
        raise CheckpointError(f"the checkpoint does not fit this model and optimizer: {detail}") from err
    _set_rng_state(state["rng"])
    return state["step"]


def resume(cfg: DictConfig, out_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore the checkpoint `cfg.resume` points to into model and optimizer; return the steps done.

    Raises ConfigError when there is none, it is damaged, or a RESUME_MUST_MATCH field differs
    (listing every one that does), so the user changes the command rather than the code.
    """
    try:
        path = find_checkpoint(cfg.resume, out_dir)
        state = load_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as err:
        raise ConfigError(str(err) if isinstance(err, FileNotFoundError) else f"resume: {err}") from err
    saved, current = state["config"], OmegaConf.to_container(cfg, resolve=True)
    differ = [
        f"{key} differs from the checkpoint's ({now!r} vs saved {then!r})"
        for key, now, then in differences(current, saved, RESUME_MUST_MATCH)
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


def differences(a: Any, b: Any, keys: tuple[str, ...], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, a's value, b's value) for every leaf under `keys` where two config dicts differ."""
    found = []
    for key in keys:
        x = a.get(key) if isinstance(a, dict) else None
        y = b.get(key) if isinstance(b, dict) else None
        if isinstance(x, dict) and isinstance(y, dict):
            found += differences(x, y, tuple(sorted(x.keys() | y.keys())), f"{prefix}{key}.")
        elif x != y:
            found.append((f"{prefix}{key}", x, y))
    return found
