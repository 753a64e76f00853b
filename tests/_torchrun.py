"""Run a function on several ranks through torchrun's own agent, in this process's tests.

`elastic_launch` is what `torchrun` calls: it starts an elastic agent that forks the workers, sets
RANK, WORLD_SIZE, MASTER_ADDR/PORT for each, and reports a failing rank's error. Forked workers
inherit this process's imports, so none pays for importing torch again.
"""

import gc
import signal
import uuid
from pathlib import Path
from typing import Any, Callable

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def run_on_ranks(tmp_path: Path, nprocs: int, fn: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """fn(*args) on `nprocs` ranks; returns {rank: fn's return value}. A failing rank raises
    ChildFailedError here, after the agent has stopped the others."""
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=uuid.uuid4().hex, rdzv_backend="c10d",
        rdzv_endpoint="localhost:0", max_restarts=0, start_method="fork", monitor_interval=0.05,
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "torchelastic")),
    )
    # Modules the workers would import lazily (DDP imports torch._dynamo, FSDP its own stack): once here,
    # so every forked worker inherits them instead of spending seconds on each launch.
    import torch._dynamo  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # the agent installs its own
    # Forked workers must not garbage-collect this process's leftovers (e.g. an earlier launch's
    # TCPStore, whose threads do not exist in the child): collect them here, freeze the rest.
    gc.collect()
    gc.freeze()
    try:
        return elastic_launch(config, fn)(*args)
    finally:
        gc.unfreeze()
        for s, handler in handlers.items():
            signal.signal(s, handler)
