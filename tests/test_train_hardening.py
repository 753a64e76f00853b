"""training/ under failure: torn metrics lines, bad checkpoints, NaN/Inf steps, signals, OOM.

Each test provokes one failure mode and checks what the user is left with: the message, the exit
code, and that checkpoints and metrics on disk are still whole and usable.
"""

import json
import logging
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO, SHRINK, compose_config
from model import GPT, GPTConfig
from model.attention import naive_attention, naive_attention_bytes
from training.checkpoint import CHECKPOINT_NAME, CheckpointError, load_checkpoint, save_checkpoint
from training.config import ConfigError
from training.loop import oom_message, train
from training.metrics import METRICS_FILE, SUMMARY_FILE, MetricsLogger, read_jsonl, read_summary
from training.optim import build_optimizer

CPU = torch.device("cpu")


def tiny_model_and_optimizer(n_layer: int = 1) -> tuple[GPT, torch.optim.Optimizer]:
    model = GPT(GPTConfig(n_layer, 2, 16, 32, 8))
    return model, build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), CPU)


# --- metrics.jsonl ------------------------------------------------------------------------------


def test_metrics_lines_are_on_disk_at_once_and_a_torn_line_is_skipped(tmp_path, tiny_cfg, caplog):
    out = tmp_path / "run"
    out.mkdir()
    whole = [{"step": 1, "train/loss": 4.0}, {"step": 2, "train/loss": 3.5}]
    # A run killed mid-write: two whole lines, then half of the third.
    (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in whole) + '{"step": 3, "train/lo')
    with caplog.at_level(logging.WARNING):
        logger = MetricsLogger(tiny_cfg(), out, derived={})  # the resumed run appends
        assert "ends in a torn line" in caplog.text
        logger.log(3, {"train/loss": 3.0})
        # Unbuffered: a reader (or a SIGKILL) sees the whole line before log() returns.
        assert (out / METRICS_FILE).read_text().endswith('{"step": 3, "train/loss": 3.0}\n')
        logger.finish({"status": "ok"})
        records = read_jsonl(out / METRICS_FILE)
    assert records == [*whole, {"step": 3, "train/loss": 3.0}, {"summary": {"status": "ok"}}]
    assert "skipped 1 unreadable line(s)" in caplog.text and "line [3]" in caplog.text
    assert json.loads((out / SUMMARY_FILE).read_text()) == {"status": "ok"}
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []
    # training.metrics.read_summary (compare_runs.py's reader) reads the same file through read_jsonl
    assert read_summary(out) == ({"status": "ok"}, 3)
    (out / METRICS_FILE).write_text(json.dumps(whole[0]) + "\n" + '{"summary": {"sta')  # killed while finishing
    assert read_summary(out) == ({"status": "ok"}, 1)  # falls back to summary.json


# --- checkpoints --------------------------------------------------------------------------------


class RunsCodeWhenUnpickled:
    """What a malicious "checkpoint" holds: unpickling it would create a file (it could do worse)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _flip_a_weight_byte(path: Path) -> None:
    """Change one byte inside the largest tensor's data, leaving the zip structure valid."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", "is damaged or is not a file written by train.py"),
        ("empty", "is damaged or is not a file written by train.py"),
        ("text", "is damaged or is not a file written by train.py"),
        ("flipped_bit", "fails its CRC32 check"),
        ("bare_state_dict", "is not a checkpoint written by train.py: it has no model, optimizer, step, rng, config"),
        ("pickled_code", r"holds pickled objects other than tensors and containers \(.*GLOBAL io\.open\)"),
    ],
)
def test_a_damaged_foreign_or_unsafe_checkpoint_is_refused_naming_the_file(tmp_path, damage, message):
    model, opt = tiny_model_and_optimizer()
    path = tmp_path / "run" / CHECKPOINT_NAME
    save_checkpoint(path, model, opt, step=3, config={"seq_len": 8})
    assert load_checkpoint(path)["step"] == 3
    marker = tmp_path / "unpickling-ran-code"
    if damage == "truncated":  # e.g. a copy that did not finish
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "text":
        path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\n")  # an LFS pointer
    elif damage == "flipped_bit":
        _flip_a_weight_byte(path)
        torch.load(path, weights_only=True)  # torch alone loads it without complaint
    elif damage == "bare_state_dict":
        torch.save(model.state_dict(), path)
    else:
        torch.save({"model": RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)
    assert not marker.exists()  # weights_only=True: nothing was executed


def test_resume_reports_a_damaged_checkpoint_as_a_config_error(tiny_cfg, pattern_data, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / CHECKPOINT_NAME).write_bytes(b"\x00" * 100)
    with pytest.raises(ConfigError, match=r"resume: checkpoint .*checkpoint\.pt is damaged"):
        train(tiny_cfg("attention=sdpa", "resume=true"))


def test_resume_lists_every_differing_field_and_allows_another_attention(tiny_cfg, pattern_data, tmp_path):
    train(tiny_cfg("attention=sdpa", "steps=2", "ckpt_every=2"))
    with pytest.raises(ConfigError) as err:
        train(tiny_cfg("attention=sdpa", "steps=2", "resume=true", "seq_len=16", "model.n_layer=2", "batch_size=2"))
    message = str(err.value)
    for field in ("batch_size differs from the checkpoint's (2 vs saved 4)",
                  "model.n_layer differs from the checkpoint's (2 vs saved 1)",
                  "seq_len differs from the checkpoint's (16 vs saved 32)"):
        assert field in message, message
    assert str(tmp_path / "run" / CHECKPOINT_NAME) in message
    # The weights mean the same under every attention, and num_proc only changes how tokens are made.
    summary = train(tiny_cfg("attention=naive", "steps=3", "ckpt_every=3", "resume=true", "data.num_proc=2"))
    assert summary["status"] == "ok" and load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)["step"] == 3
    # Same config, but weights of another shape (say, copied from elsewhere): refused, not half-loaded.
    state = load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    state["model"] = tiny_model_and_optimizer()[0].state_dict()
    torch.save(state, tmp_path / "run" / CHECKPOINT_NAME)
    with pytest.raises(ConfigError, match="does not fit this model and optimizer: .*size mismatch"):
        train(tiny_cfg("attention=sdpa", "steps=4", "resume=true"))


def test_weights_with_nan_never_overwrite_a_checkpoint(tmp_path):
    model, opt = tiny_model_and_optimizer()
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, model, opt, step=5, config={})
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not writing .*NaN/Inf in the weights \['.*weight'\]"):
        save_checkpoint(path, model, opt, step=6, config={})
    assert load_checkpoint(path)["step"] == 5 and [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


# --- NaN / Inf ----------------------------------------------------------------------------------


class _NaNGradient(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradients are poisoned."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


@pytest.fixture
def poison(monkeypatch):
    """poison(kind, steps): the training forward passes of those (1-based) steps give a NaN loss
    ("loss") or a finite loss with NaN gradients ("grad"). One micro-batch per step."""

    def arm(kind: str, steps: set[int]) -> list[int]:
        forward, calls = GPT.forward, []

        def poisoned(self, idx, targets=None):
            logits, loss = forward(self, idx, targets)
            if torch.is_grad_enabled() and idx.device.type != "meta":  # training: not evaluation, not FLOP counting
                calls.append(len(calls) + 1)
                if calls[-1] in steps:
                    loss = loss * float("nan") if kind == "loss" else _NaNGradient.apply(loss)
            return logits, loss

        monkeypatch.setattr(GPT, "forward", poisoned)
        return calls

    return arm


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_nonfinite_step_stops_the_run_and_keeps_the_last_checkpoint(tiny_cfg, pattern_data, poison, caplog, kind):
    cfg = tiny_cfg("attention=sdpa", "ckpt_every=2")  # 6 steps
    poison(kind, {5})
    with caplog.at_level(logging.ERROR):
        summary = train(cfg)
    out = Path(cfg.out_dir)
    assert summary["status"] == "nonfinite" and summary["error"].startswith("step 5: loss ")
    assert "step 5: loss " in caplog.text and "Stopped before the optimizer step" in caplog.text
    assert f"the last checkpoint, {out / CHECKPOINT_NAME}, is kept" in caplog.text
    assert "skip_nonfinite_steps=true" in caplog.text
    state = load_checkpoint(out / CHECKPOINT_NAME)
    assert state["step"] == 4 and all(torch.isfinite(t).all() for t in state["model"].values())
    records = read_jsonl(out / METRICS_FILE)
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]
    assert records[-1]["summary"]["status"] == "nonfinite"


def test_skip_nonfinite_steps_skips_the_batch_and_counts_it(tiny_cfg, pattern_data, poison, caplog):
    cfg = tiny_cfg("attention=sdpa", "ckpt_every=6", "skip_nonfinite_steps=true")
    poison("grad", {2, 4})
    with caplog.at_level(logging.WARNING):
        summary = train(cfg)
    assert summary["status"] == "ok" and summary["skipped_steps"] == 2 and summary["steps_done"] == 6
    assert "step 4: loss " in caplog.text and "batch skipped, weights unchanged" in caplog.text
    rows = [r for r in read_jsonl(Path(cfg.out_dir) / METRICS_FILE) if "train/loss" in r]
    assert [r.get("train/skipped_steps", 0) for r in rows] == [0, 1, 1, 2, 2, 2]
    state = load_checkpoint(Path(cfg.out_dir) / CHECKPOINT_NAME)
    assert state["step"] == 6 and all(torch.isfinite(t).all() for t in state["model"].values())


def test_train_step_leaves_weights_and_optimizer_untouched_on_nan(poison):
    from conftest import PatternDataset
    from training.loop import NonFiniteStep, train_step

    torch.manual_seed(0)
    model, opt = GPT(GPTConfig(1, 2, 32, 48, 16)), None
    opt = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), CPU)
    x, y = PatternDataset(seq_len=16).sample_batch("train", 2, step=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    poison("loss", {1})
    with pytest.raises(NonFiniteStep, match="loss nan, gradient norm nan"):
        train_step(model, opt, iter([(x, y)]), 1, lr=1e-2, grad_clip=0.0, autocast=lambda: torch.autocast("cpu", enabled=False))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert opt.state_dict()["state"] == {} and all(p.grad is None for p in model.parameters())


# --- out of memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_naive_attention_bytes_match_what_autograd_keeps(dtype):
    b, h, n = 2, 3, 40
    q, k, v = (torch.randn(b, h, n, 8, requires_grad=True) for _ in range(3))
    kept = {}

    def pack(t):
        if t.dim() == 4 and t.shape[-2:] == (n, n):  # the N×N tensors saved for the backward
            kept[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            naive_attention(q, k, v, causal=True)
    one, all_layers = naive_attention_bytes(b, h, n, 5, dtype, "cpu")
    assert one == b * h * n * n * torch.finfo(dtype).bits // 8
    assert all_layers == 5 * sum(kept.values())
    # CUDA autocast saves fp32 P for softmax's backward and bf16 P for P·V's: GPT-2 medium at 8K.
    assert naive_attention_bytes(2, 16, 8192, 24, torch.bfloat16, "cuda") == (4 * 2**30, 24 * 12 * 2**30)


def test_oom_message_estimates_the_naive_matrices_and_advises(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=150 * 10**9))
    cfg = compose_config("attention=naive", "model=gpt2-medium", "seq_len=8192", "batch_size=2")
    message = oom_message(cfg, 2, torch.bfloat16, torch.device("cuda"))
    assert message.startswith("out of GPU memory: attention=naive model=gpt2-medium seq_len=8192 batch_size=2 (micro-batch 2).")
    assert "2×16×8192² scores: 4.0 GiB per matrix in bfloat16" in message
    assert "the backward needs 288.0 GiB of them kept over 24 layers (this GPU has 139.7 GiB)" in message
    assert message.endswith("Try attention=flash (no N×N matrices), a smaller batch_size, or a larger grad_accum.")
    flash = oom_message(compose_config("attention=flash", "seq_len=8192"), 1, torch.bfloat16, torch.device("cuda"))
    assert "N×N" not in flash and "attention=flash" in flash and flash.endswith("Try a smaller batch_size or a larger grad_accum (the same tokens per step, fewer at once).")


# Runs train.py's own main() with train_step raising CUDA's out-of-memory error for naive attention.
SIMULATED_OOM = """
import sys
import kernels  # noqa: F401
import torch
import training.loop
from model.attention import naive_attention
real_step = training.loop.train_step

def train_step(model, *args, **kwargs):
    if model.blocks[0].attn.attend is naive_attention:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 288.00 GiB")
    return real_step(model, *args, **kwargs)

training.loop.train_step = train_step
sys.argv = ["train.py", *sys.argv[1:]]
import runpy
runpy.run_path("train.py", run_name="__main__")  # as `python train.py ...` (Hydra finds configs/ by the file)
"""


def test_oom_exits_nonzero_alone(tiny_cfg, pattern_data, monkeypatch, caplog):
    """train.py's main() on a single run (Hydra's mode RUN): the summary says oom, the exit code is 1."""
    import train as entry  # train.py

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 288.00 GiB")

    monkeypatch.setattr("training.loop.train_step", oom)
    monkeypatch.setattr(entry.HydraConfig, "get", lambda: SimpleNamespace(mode=entry.RunMode.RUN))
    cfg = tiny_cfg("attention=naive")
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exit_:
        entry.main.__wrapped__(cfg)
    assert exit_.value.code == 1
    assert "out of GPU memory: attention=naive model=tiny seq_len=32 batch_size=4 (micro-batch 4)." in caplog.text
    assert "4×2×32² scores: 32.0 KiB per matrix in float32, and the backward needs 32.0 KiB" in caplog.text
    assert json.loads((Path(cfg.out_dir) / SUMMARY_FILE).read_text())["status"] == "oom"


def test_oom_in_a_sweep_is_recorded_and_the_next_job_runs(tmp_path):
    """`python train.py -m attention=naive,sdpa` where naive runs out of memory: exit 0, both jobs recorded."""
    overrides = [*SHRINK, "steps=2", "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000"]
    sweep = subprocess.run(
        [sys.executable, "-c", SIMULATED_OOM, "-m", "attention=naive,sdpa", *overrides,
         f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "out of GPU memory: attention=naive model=tiny seq_len=32" in sweep.stdout + sweep.stderr
    assert "Traceback" not in sweep.stdout + sweep.stderr
    jobs = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    status = {p.name: json.loads((p / SUMMARY_FILE).read_text())["status"] for p in jobs}
    assert status == {"0-naive-tiny-n32": "oom", "1-sdpa-tiny-n32": "ok"}


# --- interruption -------------------------------------------------------------------------------


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


# A run (data=synthetic, checkpoints every 2 steps) whose second checkpoint write stalls halfway
# through the file, so the test can SIGKILL it there. argv: out_dir, cache_dir.
STALLS_IN_SECOND_CHECKPOINT = """
import io, sys, time
sys.path.insert(0, "tests")
from conftest import SHRINK, compose_config
import torch
from training.loop import train

real_save, saves = torch.save, []

def stalling_save(obj, f, *args, **kwargs):
    saves.append(f)
    if len(saves) < 2:
        return real_save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer)
    with open(f, "wb") as half:
        half.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        half.flush()
        print("HALF WRITTEN", flush=True)
        time.sleep(600)

torch.save = stalling_save
out, cache = sys.argv[1:]
train(compose_config(*SHRINK, "attention=sdpa", "ckpt_every=2", "data=synthetic", "data.vocab_size=100",
                     "data.num_tokens=5000", f"out_dir={out}", f"cache_dir={cache}"))
"""


def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, tiny_cfg):
    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLS_IN_SECOND_CHECKPOINT, str(out), str(cache)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()  # blocks until the writer is halfway through (or the process ends)
    if line.strip() != "HALF WRITTEN":
        proc.kill()
        pytest.fail(f"the run did not reach its second checkpoint: {line}{proc.communicate()[1][-3000:]}")
    temp = out / (CHECKPOINT_NAME + ".tmp")
    assert temp.stat().st_size > 0
    proc.kill()  # SIGKILL: no handler, no cleanup, no flush
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    assert load_checkpoint(out / CHECKPOINT_NAME)["step"] == 2  # the previous checkpoint, whole
    with pytest.raises(CheckpointError, match="is damaged"):
        load_checkpoint(temp)  # what was being written
    assert [r["step"] for r in read_jsonl(out / METRICS_FILE) if "train/loss" in r] == [1, 2, 3, 4]
    summary = train(tiny_cfg("attention=sdpa", "ckpt_every=2", "data=synthetic", "data.vocab_size=100",
                             "data.num_tokens=5000", f"cache_dir={cache}", "resume=true"))
    assert summary["status"] == "ok" and summary["steps_done"] == 6
    assert load_checkpoint(out / CHECKPOINT_NAME)["step"] == 6 and not temp.exists()
    steps = [r["step"] for r in read_jsonl(out / METRICS_FILE) if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 3, 4, 5, 6]  # steps 3-4 ran again from the step-2 checkpoint
