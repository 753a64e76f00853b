"""training/wandb_run.py: what a wandb run holds, read back from the offline run file (_wandb_file.py)
as `wandb sync` would upload it: summary = summary.json, tokens x-axis, unique names, one group per
sweep, resolved config, train.log, and a resumed run continuing the same wandb run."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from _wandb_file import offline_runs, read_run
from conftest import REPO, SHRINK, compose_config
from omegaconf import OmegaConf

from scripts import compare_runs
from training import train
from training.metrics import METRICS_FILE, SUMMARY_FILE, read_jsonl
from training.wandb_run import WANDB_RUN_FILE, kernel_settings, names, run_config

# a quickstart-like sweep, shrunk: 3 attentions and naive once more (a repeated configuration)
SWEEP = [*(o for o in SHRINK if o != "logger=none"), "batch_size=2", "steps=2", "eval_steps=1", "ckpt_every=2", "logger=wandb",
         "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000"]


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """wandb's settings in tmp_path (not ~/.config); its banner not silenced by the environment."""
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    return {**os.environ}


def wandb_summary_of(run) -> dict:
    return {k: v for k, v in run.summary.items() if not k.startswith("_")}


@pytest.mark.slow
def test_sweep_and_resume_as_wandb_sync_would_upload_them(tmp_path, wandb_env, capsys):
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, "train.py", "-m", *SWEEP, "attention=naive,sdpa,flash,naive",
         f"hydra.sweep.dir={sweep}", f"cache_dir={tmp_path / 'cache'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=wandb_env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0-naive-tiny-n32", "1-sdpa-tiny-n32", "2-flash-tiny-n32", "3-naive-tiny-n32"]
    # logger.quiet (default): our one line per run, none of wandb's banner
    assert output.count("wandb: offline run ") == 4 and "wandb sync" in output
    assert not re.search(r"^wandb: ", output, re.MULTILINE), output[-3000:]

    runs = {}
    for job in jobs:
        [run] = offline_runs(job)
        runs[job.name] = run
        summary = json.loads((job / SUMMARY_FILE).read_text())
        wandb_summary = wandb_summary_of(run)
        # the run's aggregates are exactly summary.json's, and no per-step value sits beside them
        assert {k: wandb_summary.get(k) for k in summary} == summary, job.name
        assert summary["final/tokens_per_s_median"] > 0 and not any(k.startswith("perf/") for k in wandb_summary)
        assert wandb_summary["flops/attn_fwd_algorithmic"] > 0 and "flops/attn_fwd_executed" in wandb_summary
        # history: every step, each with its tokens; the x-axis declared for the UI
        steps = [r for r in read_jsonl(job / METRICS_FILE) if "train/loss" in r]
        history = [r for r in run.history if "train/loss" in r]
        assert [(r["_step"], r["train/tokens"], r["train/loss"]) for r in history] == \
               [(r["step"], r["step"] * 2 * 32, r["train/loss"]) for r in steps]
        metrics = {m.name or m.glob_name: m for m in run.metrics}
        assert metrics["train/loss"].step_metric == "train/tokens" and metrics["perf/*"].summary.none
        assert wandb_summary["train/loss"] == {"min": min(r["train/loss"] for r in steps), "last": steps[-1]["train/loss"]}
        # config: what ran, not auto/null
        config = run.config
        assert (config["dtype"], config["compile"], config["device"]) == ("float32", False, "cpu")
        assert (config["batch_size"], config["tokens_per_step"]) == (2, 64)
        assert config["system"]["triton_interpreter"] is True and config["system"]["torch"]
        assert config["derived"]["params"] > 0
        # the console log goes with the run
        assert "train.log" in run.files
        assert "step 2/2" in next(job.glob("wandb/offline-run-*/files/train.log")).read_text()
        assert run.exit_code == 0 and run.run.job_type == "train"

    names_ = [r.run.display_name for r in runs.values()]
    assert len(set(names_)) == 4 and all(n.startswith(j.split("-", 1)[1]) for n, j in zip(names_, runs))
    assert len({r.run.run_group for r in runs.values()}) == 1 and runs["0-naive-tiny-n32"].run.run_group.startswith("sweep-")
    assert set(runs["2-flash-tiny-n32"].run.tags) == {"flash", "tiny", "seq32"}
    flash_kernel = runs["2-flash-tiny-n32"].config["kernel"]
    # deterministic=auto, torch's switch off: the fastest schedule, in the interpreter the fused one
    assert flash_kernel["fwd"]["BLOCK_M"] > 0 and flash_kernel["backward_schedule"] == "fused" and "bwd_fused" in flash_kernel
    assert runs["1-sdpa-tiny-n32"].config["kernel"] is None

    # resume the first job for 2 more steps into a new folder: the same wandb run goes on
    first = jobs[0]
    cfg = compose_config(*SWEEP, "attention=naive", "steps=4", f"resume={first}",
                         f"out_dir={tmp_path / 'resumed'}", f"cache_dir={tmp_path / 'cache'}")
    assert train(cfg)["status"] == "ok"
    [resumed] = offline_runs(tmp_path / "resumed")
    before = runs[first.name]
    assert resumed.run.run_id == before.run.run_id and resumed.run.display_name == before.run.display_name
    assert resumed.run.run_group == before.run.run_group and resumed.run.resume and not before.run.resume
    rows = [r for r in resumed.history if "train/loss" in r]
    assert [(r["_step"], r["train/tokens"]) for r in rows] == [(3, 3 * 64), (4, 4 * 64)]
    assert rows[0]["time/elapsed_s"] > [r for r in before.history if "train/loss" in r][-1]["time/elapsed_s"]
    assert json.loads((tmp_path / "resumed" / WANDB_RUN_FILE).read_text())["id"] == before.run.run_id

    # compare_runs on the sweep: one naive row kept, the repeat set aside in one line
    capsys.readouterr()
    rows = compare_runs.main([str(sweep), "--out", str(tmp_path / "cmp.json"), "--no-plot"])
    printed = capsys.readouterr().out
    assert [r["attention"] for r in rows] == ["naive", "sdpa", "flash"]
    assert "set aside 1 repeated run(s) of a configuration shown above (1 ok)" in printed


@pytest.mark.slow  # the first wandb run in a process starts wandb's service (seconds)
def test_reader_reassembles_records_split_over_blocks(tmp_path, wandb_env):
    """A config value bigger than a 32 KiB block is written as FIRST/MIDDLE/LAST chunks."""
    import wandb

    big = "x" * 80_000
    run = wandb.init(project="reader-test", mode="offline", dir=str(tmp_path), config={"big": big, "n": 3},
                     settings=wandb.Settings(console="off", silent=True))
    run.log({"a": 1.5}, step=1, commit=True)
    run.summary.update({"done": True})
    run.finish()
    [path] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    [read] = offline_runs(tmp_path)
    assert read.config["big"] == big and read.config["n"] == 3 and read.summary["done"] is True
    assert [(r["_step"], r["a"]) for r in read.history] == [(1, 1.5)]
    damaged = tmp_path / "damaged.wandb"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged chunk"):
        read_run(damaged)


def test_names_and_group_outside_a_sweep():
    cfg = compose_config("model=tiny", "seq_len=64", "attention=flash", "attention.deterministic=true", "logger=wandb")
    name, group = names(cfg)
    assert re.fullmatch(r"flash_two_pass-tiny-n64-\d{4}-\d{6}", name) and group == "default"
    cfg.logger.group = "ablation"
    assert names(cfg)[1] == "ablation"


def test_config_holds_resolved_values_and_the_kernel_settings(tmp_path):
    cfg = compose_config("model=tiny", "seq_len=64", "attention=flash", "attention.deterministic=true", f"out_dir={tmp_path}")
    cfg.batch_size = 16  # as validate_config resolves tokens_per_step
    derived = {"dtype": "bfloat16", "compile": True, "device": "cpu", "tokens_per_step": 1024,
               "attention": "flash_two_pass", "device_name": "cpu"}
    config = run_config(cfg, derived)
    assert OmegaConf.to_container(cfg)["dtype"] == "auto"
    assert (config["dtype"], config["compile"], config["device"], config["tokens_per_step"]) == ("bfloat16", True, "cpu", 1024)
    assert config["batch_size"] == 16 and config["attention_label"] == "flash_two_pass" and config["system"]["gpu"] == "cpu"
    kernel = config["kernel"]
    assert set(kernel) == {"forward_kernel", "backward_schedule", "tma", "fwd", "bwd_dq", "bwd_dkdv"} and kernel["backward_schedule"] == "two_pass"
    assert {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "REVERSE", "TMA"} <= set(kernel["fwd"])
    cfg.attention.deterministic = False  # the fastest schedule: in the interpreter, the fused one
    assert set(kernel_settings(cfg, "float32", "cpu")) == {"forward_kernel", "backward_schedule", "tma", "fwd", "bwd_fused"}
    assert kernel_settings(compose_config("attention=sdpa"), "float32", "cpu") is None


def test_kernel_settings_show_the_hopper_kernels_where_they_are_picked(monkeypatch):
    from kernels.flash_attn import launch

    asked = []

    def pick(q, k=None, documents=False):
        asked.append((q.shape[2], documents))
        return "hopper"

    monkeypatch.setattr(launch, "fastest_schedule", pick)
    monkeypatch.setattr(launch, "fastest_forward", pick)
    cfg = compose_config("model=tiny", "seq_len=4096", "attention=flash", "attention.deterministic=false")
    settings = kernel_settings(cfg, "bfloat16", "cpu")
    assert asked == [(4096, False)] * 2  # the run's length, unmasked: the backward's pick, the forward's
    assert settings["backward_schedule"] == "hopper" and settings["forward_kernel"] == "hopper"
    assert set(settings) == {"forward_kernel", "backward_schedule", "tma", "fwd_hopper", "bwd_hopper"}  # no `tl` fwd
    key = launch._table_key(cfg.model.n_embd // cfg.model.n_head, torch.bfloat16)
    assert settings["bwd_hopper"] == dataclasses.asdict(launch.HOPPER_BACKWARD[key])
    assert settings["fwd_hopper"] == dataclasses.asdict(launch.HOPPER_FORWARD[key])
    cfg.attention.window = 256  # a sliding window: the Hopper kernels take it, no documents
    asked.clear()
    windowed = kernel_settings(cfg, "bfloat16", "cpu")
    assert asked == [(4096, False)] * 2
    assert windowed["bwd_hopper"] == dataclasses.asdict(launch.hopper_backward_config(cfg.model.n_embd // cfg.model.n_head, torch.bfloat16, window=True))
    cfg.data.document_mask = True  # document ids: the picks are asked for them
    asked.clear()
    kernel_settings(cfg, "bfloat16", "cpu")
    assert asked == [(4096, True)] * 2
