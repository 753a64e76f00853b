"""Train a GPT-2 with a switchable attention: `python train.py attention=flash seq_len=8192`.

Config: configs/config.yaml and its groups (attention, model, data, logger, experiment).
Sweep: `python train.py -m attention=naive,sdpa,flash seq_len=1024,2048,4096,8192`.
Several GPUs: `torchrun --nproc_per_node=8 train.py ...` (training/distributed.py).
"""

import logging
import signal
import sys

import kernels  # noqa: F401  first: picks Triton's backend (CPU interpreter without CUDA) before torch imports triton
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from training import distributed
from training.config import ConfigError
from training.loop import train

log = logging.getLogger("train")


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    # In a -m sweep a failed job must return, not exit, so Hydra goes on to the next job.
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        summary = train(cfg)
    except ConfigError as err:
        distributed.record_failure(err)  # under torchrun: its closing report shows this message
        log.error("config error: %s", err)  # one line naming the field; no traceback
        if multirun:
            return None
        sys.exit(2)
    except Exception as err:
        distributed.record_failure(err)
        raise  # Hydra prints it
    if summary["status"] == "interrupted":  # SIGTERM/Ctrl-C ends a -m sweep too, with the shell's code (143/130)
        sys.exit(128 + signal.Signals[summary["signal"]].value)
    if summary["status"] != "ok" and not multirun:
        sys.exit(1)
    return summary.get("final/val_loss")  # what a Hydra sweeper would optimise


if __name__ == "__main__":
    with distributed.torchrun_process(sys.argv):  # ranks > 0 write no files; the process group ends with the process
        main()
