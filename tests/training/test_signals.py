"""training/signals.py: Ctrl-C and SIGTERM finish the step, save a checkpoint, and the run resumes."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, SHRINK

from training import train
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from training.metrics import METRICS_FILE, SUMMARY_FILE, read_jsonl


def wait_for(condition, what: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Poll until condition() holds; fail with the process's output if it ends or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"never saw {what} (exit code {proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        time.sleep(0.05)


def step_lines(out: Path) -> int:
    path = out / METRICS_FILE
    return sum(1 for r in read_jsonl(path) if "train/loss" in r) if path.exists() else 0


def test_ctrl_c_finishes_the_step_saves_and_resumes(tiny_cfg, pattern_data, monkeypatch, caplog):
    import training.loop

    real_step, calls = training.loop.train_step, []

    def step_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # arrives mid-step, as a real Ctrl-C would
        return real_step(*args, **kwargs)

    monkeypatch.setattr(training.loop, "train_step", step_then_ctrl_c)
    cfg = tiny_cfg("attention=sdpa", "ckpt_every=5")  # no checkpoint is due at step 3
    with caplog.at_level(logging.WARNING):
        summary = train(cfg)
    out = Path(cfg.out_dir)
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGINT" and summary["steps_done"] == 3
    assert f"SIGINT: stopped after step 3; checkpoint saved in {out}. Continue with resume={out}" in caplog.text
    assert load_checkpoint(out / CHECKPOINT_NAME)["step"] == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works as usual again
    assert train(tiny_cfg("attention=sdpa", "ckpt_every=5", "resume=true"))["status"] == "ok"
    assert [r["step"] for r in read_jsonl(out / METRICS_FILE) if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    """`kill <pid>` (or a scheduler's stop) on `python train.py`: exit code 143, no traceback, resumable."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "train.py", *SHRINK, "attention=sdpa", "steps=100000", "ckpt_every=100000",
         "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000",
         f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={out}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    wait_for(lambda: step_lines(out) >= 2, "two training steps", proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert load_checkpoint(out / CHECKPOINT_NAME)["step"] == summary["steps_done"] == step_lines(out) >= 2
    assert f"SIGTERM: stopped after step {summary['steps_done']}; checkpoint saved in {out}" in stdout + stderr


def test_a_second_ctrl_c_stops_mid_step_with_the_summary_and_the_last_checkpoint(tiny_cfg, pattern_data, monkeypatch, caplog):
    """In process: Ctrl-C twice inside step 3 leaves it at once; step 2's checkpoint stays whole."""
    import training.loop

    real_step, calls = training.loop.train_step, []

    def step_then_two_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises StopNow here, before this step's work
        return real_step(*args, **kwargs)

    monkeypatch.setattr(training.loop, "train_step", step_then_two_ctrl_c)
    cfg = tiny_cfg("attention=sdpa", "ckpt_every=1")
    with caplog.at_level(logging.INFO):
        summary = train(cfg)
    out = Path(cfg.out_dir)
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGINT" and summary["steps_done"] == 2
    assert "final/val_loss" not in summary  # no evaluation at step 2 (eval_every=0): nothing stale reported
    assert json.loads((out / SUMMARY_FILE).read_text())["status"] == "interrupted"
    assert "SIGINT: stopping after this step; press Ctrl-C again to stop now" in caplog.text
    assert (f"SIGINT: stopped during step 3; the last checkpoint ({out / CHECKPOINT_NAME}) is kept as it was. "
            f"Continue with resume={out}") in caplog.text
    assert load_checkpoint(out / CHECKPOINT_NAME)["step"] == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow
def test_a_long_first_step_warns_at_start_and_two_ctrl_c_end_it_at_once(tmp_path):
    """`python train.py` with a step of minutes in the Triton interpreter: a warning before the data work,
    progress inside step 1, the first Ctrl-C acknowledged at once, the second ends the run: exit 130,
    status interrupted, one line and no traceback."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "train.py", *SHRINK, "attention=flash", "seq_len=2048", "batch_size=8", "model.n_layer=2",
         "data=synthetic", "data.vocab_size=100", "data.num_tokens=40000",
         f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={out}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    watchdog = threading.Timer(300, proc.kill)  # reading lines blocks: a hung run must still end the test
    watchdog.start()
    lines: list[str] = []

    def read_until(text: str) -> str:
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                return line
        pytest.fail(f"never saw {text!r} (exit code {proc.wait()}):\n{''.join(lines)[-3000:]}")

    warning = read_until("one training step is estimated at")
    assert "experiment=quickstart" in warning and "attention=sdpa" in warning
    assert not any("model tiny" in line for line in lines)  # said before the data and the model are built
    read_until("step 1: micro-batch 1/1 forward (estimated ~")
    proc.send_signal(signal.SIGINT)
    read_until("SIGINT: stopping after this step; press Ctrl-C again to stop now")
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert "SIGINT: stopped during step 1; no checkpoint (ckpt_every=0)" in output
    watchdog.cancel()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["status"] == "interrupted" and summary["steps_done"] == 0
