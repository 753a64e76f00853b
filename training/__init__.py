"""The trainer: `train(cfg)` (loop.py) built from small steps.

setup.py builds a run (data, model, optimizer, resume), batches.py feeds it, loop.py steps it,
checkpoint.py saves and resumes it, metrics.py records it, console.py and profiling.py report it,
signals.py stops it cleanly, distributed.py spreads it over torchrun's ranks. The config's types
are schema.py's dataclasses; config.py checks what spans fields.
"""

import kernels  # noqa: F401  first: picks Triton's backend before torch.compile or the FLOP counter import triton
from training import schema  # noqa: F401  registers the config schema in Hydra's ConfigStore
from training.loop import train

__all__ = ["train"]
