"""training/checkpoint.py: save, load, the resume rules, and checkpoints damaged, foreign, unsafe or half-written."""

import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from _tiny import CPU, read_metrics, tiny_model_and_optimizer
from conftest import CONFIGS, REPO, SHRINK

from model import GPT, GPTConfig
from training import train
from training.checkpoint import (
    CHECKPOINT_NAME,
    RESUME_MUST_MATCH,
    CheckpointError,
    differences,
    find_checkpoint,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from training.config import ConfigError
from training.metrics import METRICS_FILE, read_jsonl
from training.optim import build_optimizer


def test_save_then_restore_puts_back_weights_moments_step_and_rng(tmp_path):
    model, opt = tiny_model_and_optimizer()
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward()
    opt.step()  # Adam moments exist
    torch.manual_seed(7)
    path = tmp_path / "run" / CHECKPOINT_NAME
    save_checkpoint(path, model, opt, step=3, config={"seq_len": 8})
    expected_draw = torch.rand(4)  # what the RNG gives right after saving

    other, other_opt = tiny_model_and_optimizer()  # fresh weights, no moments
    state = load_checkpoint(path)
    assert state["step"] == 3 and state["config"] == {"seq_len": 8}
    assert restore_checkpoint(state, other, other_opt) == 3
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    for i, moments in opt.state_dict()["state"].items():
        for key, value in moments.items():
            assert torch.equal(value, other_opt.state_dict()["state"][i][key]), (i, key)
    assert torch.equal(torch.rand(4), expected_draw)  # the RNG continues where the saved run was


def test_find_checkpoint_takes_true_a_folder_or_a_file(tmp_path):
    model, opt = tiny_model_and_optimizer()
    run = tmp_path / "run"
    save_checkpoint(run / CHECKPOINT_NAME, model, opt, step=1, config={})
    assert find_checkpoint(True, run) == find_checkpoint(str(run), tmp_path) == find_checkpoint(str(run / CHECKPOINT_NAME), tmp_path)
    with pytest.raises(FileNotFoundError, match="resume=True: no checkpoint at .*checkpoint.pt"):
        find_checkpoint(True, tmp_path)


def test_differences_lists_every_changed_leaf_under_the_keys():
    saved = {"seq_len": 32, "model": {"n_layer": 1, "n_head": 2}, "data": {"name": "stdlib"}, "lr": 1e-3}
    now = {"seq_len": 16, "model": {"n_layer": 2, "n_head": 2}, "data": {"name": "stdlib", "num_proc": 4}, "lr": 1.0}
    assert differences(now, saved, RESUME_MUST_MATCH) == [
        ("model.n_layer", 2, 1), ("seq_len", 16, 32), ("data.num_proc", 4, None),  # lr may change on resume
    ]


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, tiny_cfg, pattern_data):
    """3 steps, stop, resume, 3 more == 6 steps straight: same losses, same final weights."""
    straight = tiny_cfg("attention=sdpa", f"out_dir={tmp_path / 'straight'}", "ckpt_every=3")
    train(straight)
    split = [f"out_dir={tmp_path / 'split'}", "attention=sdpa", "ckpt_every=3"]
    train(tiny_cfg(*split, "stop_at=3"))
    assert load_checkpoint(tmp_path / "split" / CHECKPOINT_NAME)["step"] == 3
    train(tiny_cfg(*split, "resume=true"))

    def losses(name):
        return [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path / name)[0]]

    assert losses("split") == losses("straight") and len(losses("split")) == 6
    a, b = (load_checkpoint(tmp_path / name / CHECKPOINT_NAME) for name in ("straight", "split"))
    assert a["step"] == b["step"] == 6
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key


def test_resume_refuses_a_different_run(tmp_path, tiny_cfg, pattern_data):
    run = f"out_dir={tmp_path / 'run'}"
    train(tiny_cfg(run, "attention=sdpa", "steps=2", "ckpt_every=2"))
    with pytest.raises(ConfigError, match=r"resume: seq_len differs from the checkpoint's \(16 vs saved 32\)"):
        train(tiny_cfg(run, "attention=sdpa", "seq_len=16", "resume=true"))
    with pytest.raises(ConfigError, match="resume='nowhere': no checkpoint at nowhere"):
        train(tiny_cfg(run, "resume=nowhere"))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    model = GPT(GPTConfig(1, 2, 16, 32, 8))
    opt = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), CPU)
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, model, opt, step=5, config={"seq_len": 8})

    def crash(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, opt, step=6, config={"seq_len": 8})
    assert load_checkpoint(path)["step"] == 5  # the previous checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]  # no temporary left behind


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


# A run (data=synthetic, checkpoints every 2 steps) whose second checkpoint write stalls halfway
# through the file, so the test can SIGKILL it there. argv: the config directory, then overrides.
STALLS_IN_SECOND_CHECKPOINT = """
import io, sys, time
import torch
from hydra import compose, initialize_config_dir
from training import train

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
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    train(compose(config_name="config", overrides=sys.argv[2:]))
"""


@pytest.mark.slow
def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, tiny_cfg):
    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLS_IN_SECOND_CHECKPOINT, str(CONFIGS), *SHRINK, "attention=sdpa", "ckpt_every=2",
         "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000", f"out_dir={out}", f"cache_dir={cache}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()  # blocks until the writer is halfway through (or the process ends)
    if line.strip() != "HALF WRITTEN":
        proc.kill()
        pytest.fail(f"the run did not reach its second checkpoint: {line}{proc.communicate()[1][-3000:]}")
    (temp,) = out.glob(f".{CHECKPOINT_NAME}.*.tmp")  # data.files.atomic_path's temporary name
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
