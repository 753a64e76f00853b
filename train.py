"""Train a GPT-2 with a switchable attention: `python train.py attention=flash seq_len=8192`.

Config: configs/config.yaml and its groups (attention, model, data, logger, experiment), typed by
training/schema.py. Sweep: `python train.py -m attention=naive,sdpa,flash seq_len=1024,2048,4096,8192`.
Several GPUs: `torchrun --nproc_per_node=8 train.py ...` (training/distributed.py).
"""

import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import DictConfig

log = logging.getLogger("train")
CONFIGS = Path(__file__).resolve().parent / "configs"
# Hydra reports a config it cannot compose (`lr=abc`, an unknown key) in several lines and exits 1;
# with HYDRA_FULL_ERROR set it raises instead, so __main__ can give the one line and exit code 2 that
# ConfigError gets. The user's own setting comes back once the job starts.
USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR")


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from training import distributed, train
    from training.config import ConfigError

    _restore_full_error()  # composed: errors from here on get Hydra's usual report
    # In a -m sweep a failed job must return, not exit, so Hydra goes on to the next job.
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        summary = train(cfg)
    except ConfigError as err:
        distributed.record_failure(err)  # under torchrun: its closing report shows this message
        log.error("config error: %s", err)  # one line naming the field; no traceback
        remove_unused_run_folder(Path(cfg.out_dir))
        if multirun:
            return None
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C before the first step (data, tokenizer, model); the loop handles its own
        log.warning("interrupted (Ctrl-C) before the first step; nothing to resume")
        sys.exit(128 + signal.SIGINT)
    except Exception as err:
        distributed.record_failure(err)
        raise  # Hydra prints it
    if summary["status"] == "interrupted":  # SIGTERM/Ctrl-C ends a -m sweep too, with the shell's code (143/130)
        sys.exit(128 + signal.Signals[summary["signal"]].value)
    if summary["status"] not in ("ok", "stopped") and not multirun:  # stopped: stop_at did what it was asked
        sys.exit(1)
    return summary.get("final/val_loss")  # what a Hydra sweeper would optimise


def remove_unused_run_folder(folder: Path) -> None:
    """A run refused for its config leaves no folder behind. Hydra made it (.hydra/, train.log) before
    train() ran; a folder holding anything more (a resumed run's checkpoint and metrics) is kept."""
    if folder.is_dir() and {p.name for p in folder.iterdir()} <= {".hydra", "train.log"}:
        shutil.rmtree(folder, ignore_errors=True)


def _restore_full_error() -> None:
    if USER_FULL_ERROR is None:
        os.environ.pop("HYDRA_FULL_ERROR", None)
    else:
        os.environ["HYDRA_FULL_ERROR"] = USER_FULL_ERROR


def composition_error(err: ConfigCompositionException) -> str:
    """Hydra's multi-line report of an override or config it could not use, as one line naming the field."""
    head = str(err).split("Config search path")[0]  # Hydra appends its search path: not the user's concern
    text = "; ".join(" ".join(part.split()) for part in head.split("\n\n") if part.strip())
    cause = err.__cause__
    if getattr(cause, "full_key", None):
        text += f" ({cause.full_key}: {str(cause.msg).splitlines()[0]})"
    return text


def usage() -> str:
    """`python train.py --help`: the config groups and top-level keys with their comments, read from
    configs/config.yaml itself (the one place they are written), without importing torch."""
    lines = ["python train.py [group=option ...] [key=value ...]    -m: sweep comma lists; torchrun: several GPUs",
             "A first run on a laptop: python train.py experiment=quickstart", "", "Config groups (configs/<group>/):"]
    text = (CONFIGS / "config.yaml").read_text().splitlines()
    for line in text:
        group, _, rest = line.strip().removeprefix("- ").partition(":")
        if (CONFIGS / group).is_dir() and line.startswith("  - "):
            default, _, comment = rest.partition("#")
            options = " | ".join(sorted(p.stem for p in (CONFIGS / group).glob("*.yaml")))
            default = default.strip().replace("null", "none")
            lines.append(f"  {group:<11} {options}  (default {default}): {comment.strip().split(': ')[-1]}")
    lines += ["", "Main keys (configs/config.yaml; a group's keys as model.n_layer=..., attention.backend=...):"]
    keys = [line for line in text if line[:1].isalpha() and not line.startswith(("defaults", "hydra"))]
    lines += [f"  {line}" for line in keys]
    lines += ["", "Hydra's own options: python train.py --hydra-help"]
    return "\n".join(lines)


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):  # answered before torch is imported: in a fraction of a second
        print(usage())
        sys.exit(0)
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    from training import distributed  # importing training registers the config schema (training/schema.py)

    with distributed.torchrun_process(sys.argv):  # ranks > 0 write no files; the process group ends with the process
        try:
            main()
        except ConfigCompositionException as err:
            if USER_FULL_ERROR is not None:
                raise
            distributed.record_failure(err)
            print(f"config error: {composition_error(err)}", file=sys.stderr)
            sys.exit(2)
