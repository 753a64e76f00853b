"""Checkpoints that resume a run exactly: model, optimizer, step (which fixes both the lr schedule
and the data position, since batches are a pure function of the step) and the RNG states."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

CHECKPOINT_NAME = "checkpoint.pt"


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
    """
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "rng": _rng_state(),
        "config": config,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic on POSIX when tmp and path share a file system
    finally:
        tmp.unlink(missing_ok=True)  # only left behind if saving failed


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
    """The saved state (model, optimizer, step, rng, config), on CPU. Nothing is restored yet."""
    return torch.load(path, map_location="cpu", weights_only=True)  # weights_only: no pickled code runs


def restore_checkpoint(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Put model, optimizer and RNG back as saved; return the number of steps done."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])  # moves the moments to the params' device
    _set_rng_state(state["rng"])
    return state["step"]
