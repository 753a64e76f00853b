"""training/ and train.py: schedule, optimizer, steps, the loop end to end, checkpoints, loggers, CLI."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, SHRINK, PatternDataset
from model import GPT, GPTConfig
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from training.config import ConfigError
from training.loop import build_model, evaluate, get_batch, train, train_step
from training.metrics import METRICS_FILE, SUMMARY_FILE
from training.optim import build_optimizer, lr_at

CPU = torch.device("cpu")


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def read_metrics(out_dir: Path) -> tuple[list[dict], list[dict]]:
    """(per-step training rows, summaries) from metrics.jsonl; the FLOPs line is left out."""
    rows = [json.loads(line) for line in (out_dir / METRICS_FILE).read_text().splitlines()]
    return [r for r in rows if "train/loss" in r], [r["summary"] for r in rows if "summary" in r]


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    lr = lambda s: lr_at(s, lr=1.0, min_lr=0.1, warmup_steps=10, steps=110)  # noqa: E731
    assert [lr(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr(60) == pytest.approx(0.55)  # halfway through the cosine: the midpoint of lr and min_lr
    assert lr(110) == pytest.approx(0.1) and lr(500) == pytest.approx(0.1)
    decay = [lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(1, 2, 16, 32, 8))
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), device=CPU)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))  # tied weight once


def test_grad_accum_equals_one_big_batch():
    ds = PatternDataset(seq_len=16)
    x, y = ds.sample_batch("train", 4, step=0)
    results = []
    for accum, batches in [(1, [(x, y)]), (2, [(x[:2], y[:2]), (x[2:], y[2:])])]:
        torch.manual_seed(0)
        model = GPT(GPTConfig(1, 2, 32, 48, 16))
        opt = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), CPU)
        loss = train_step(model, opt, iter(batches), accum, lr=1e-2, grad_clip=1.0, autocast=no_autocast)
        results.append((loss, [p.detach().clone() for p in model.parameters()]))
    (loss1, params1), (loss2, params2) = results
    assert loss1 == pytest.approx(loss2, rel=1e-6)
    for a, b in zip(params1, params2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_build_model_pads_a_null_vocab_and_refuses_a_small_one(tiny_cfg):
    model = build_model(tiny_cfg(), tokenizer_vocab=4000, device=CPU)
    assert model.cfg.vocab_size == 4032 and model.cfg.seq_len == 32
    with pytest.raises(ConfigError, match="model.vocab_size=64 is smaller than the tokenizer's 4000"):
        build_model(tiny_cfg("model.vocab_size=64"), tokenizer_vocab=4000, device=CPU)


def test_evaluate_reads_the_same_val_batches_every_time():
    ds = PatternDataset(seq_len=16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(1, 2, 32, 48, 16))
    first = evaluate(model, ds, eval_steps=3, batch_size=2, device=CPU, autocast=no_autocast)
    assert first == evaluate(model, ds, eval_steps=3, batch_size=2, device=CPU, autocast=no_autocast)
    assert model.training  # evaluate() puts train mode back
    x, _ = get_batch(ds, "val", 2, 0, CPU)
    assert x.shape == (2, 16) and x.device == CPU


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash"])
def test_each_attention_trains_the_loss_down(tiny_cfg, pattern_data, attention):
    cfg = tiny_cfg(f"attention={attention}")  # 6 steps
    summary = train(cfg)
    rows, _ = read_metrics(Path(cfg.out_dir))
    losses = [r["train/loss"] for r in rows]
    assert len(losses) == 6 and summary["status"] == "ok"
    # Starts near log(64) = 4.16 (uniform over the padded vocab); the pattern is learnable.
    assert losses[0] > 3.8 and sum(losses[-2:]) / 2 < losses[0] - 0.3, losses
    assert summary["final/val_loss"] < losses[0] - 0.5, (summary, losses)


def test_metrics_jsonl_summary_and_mfu(tiny_cfg, pattern_data):
    cfg = tiny_cfg("attention=sdpa", "steps=4", "eval_every=2", "peak_tflops=1")
    summary = train(cfg)
    out = Path(cfg.out_dir)
    rows, summaries = read_metrics(out)
    flops = json.loads((out / METRICS_FILE).read_text().splitlines()[0])  # the step's FLOPs, split up
    assert flops["step"] == 0 and flops["flops/attn_bwd"] >= 2 * flops["flops/attn_fwd"] > 0
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert {"train/loss", "lr", "perf/step_ms", "perf/tokens_per_s", "perf/mfu"} <= r.keys()
        assert r["perf/tokens_per_s"] == pytest.approx(4 * 32 / (r["perf/step_ms"] / 1e3))
    assert [r["step"] for r in rows if "val/loss" in r] == [2, 4]
    assert summaries == [summary] == [json.loads((out / SUMMARY_FILE).read_text())]
    assert summary["status"] == "ok" and summary["final/train_loss"] == rows[-1]["train/loss"]
    assert 0 < summary["perf/mfu"] < 1 and "perf/peak_mem_gib" not in summary  # no GPU memory on CPU


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


def test_out_of_memory_is_reported_not_raised(tiny_cfg, pattern_data, monkeypatch, caplog):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")

    monkeypatch.setattr("training.loop.train_step", oom)
    cfg = tiny_cfg("attention=naive")
    with caplog.at_level(logging.ERROR):
        summary = train(cfg)
    assert summary["status"] == "oom"
    assert read_metrics(Path(cfg.out_dir))[1][-1]["status"] == "oom"
    assert "out of GPU memory: attention=naive model=tiny seq_len=32 batch_size=4" in caplog.text
    assert "Try attention=flash" in caplog.text


@pytest.mark.parametrize("attention, op", [("sdpa", "scaled_dot_product"), ("flash", "flashgpt::flash_attn")])
def test_profile_writes_a_trace_and_the_attention_share(tiny_cfg, pattern_data, attention, op):
    cfg = tiny_cfg(f"attention={attention}", "profile=true")
    summary = train(cfg)
    assert json.loads((Path(cfg.out_dir) / "trace.json").read_text())["traceEvents"]
    report = json.loads((Path(cfg.out_dir) / "profile.json").read_text())
    assert report["steps_profiled"] == 3
    # forward and backward both counted, each once (SDPA's inner backend op is nested, not added)
    ops = report["attention_ops_ms"]
    assert any(op in name and "bwd" in name or "backward" in name for name in ops), ops
    assert all(op in name for name in ops), ops
    assert 0 < report["attention_ms"] < report["step_ms"]
    assert report["attention_share"] == pytest.approx(report["attention_ms"] / report["step_ms"])
    assert summary["profile/attention_share"] == report["attention_share"]


def test_profile_of_naive_attention_says_its_share_is_unknown(tiny_cfg, pattern_data, caplog):
    cfg = tiny_cfg("attention=naive", "profile=true")
    with caplog.at_level(logging.INFO):
        summary = train(cfg)
    assert json.loads((Path(cfg.out_dir) / "profile.json").read_text())["attention_share"] is None
    assert "profile/attention_share" not in summary and "its share is unknown" in caplog.text


def test_wandb_offline_writes_a_run(tiny_cfg, pattern_data, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # keep ~/.config clean
    cfg = tiny_cfg("attention=sdpa", "steps=2", "logger=wandb", "logger.group=tests")
    train(cfg)
    runs = list((Path(cfg.out_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    records = list(runs[0].glob("run-*.wandb"))
    assert len(records) == 1
    expected = (b"sdpa-tiny-n32", b"tests", b"train/loss", b"perf/tokens_per_s", b"status")
    # wandb's service process writes the file; on a loaded machine it can still be flushing when
    # finish() returns, so give it time before reading (protobuf records: names appear as bytes)
    deadline = time.monotonic() + 60
    while not all(t in records[0].read_bytes() for t in expected) and time.monotonic() < deadline:
        time.sleep(0.5)
    data = records[0].read_bytes()
    for text in expected:
        assert text in data, (text, len(data))


def test_wandb_disabled_still_writes_metrics(tiny_cfg, pattern_data):
    cfg = tiny_cfg("attention=sdpa", "steps=2", "logger=wandb", "logger.mode=disabled")
    assert train(cfg)["status"] == "ok"
    assert not (Path(cfg.out_dir) / "wandb").exists()
    assert len(read_metrics(Path(cfg.out_dir))[0]) == 2


def test_cli_sweep_runs_every_job(tmp_path):
    """`python train.py -m ...` in one process, real data pipeline (data=synthetic), one folder per job."""
    result = subprocess.run(
        [sys.executable, "train.py", "-m", *SHRINK, "attention=naive,sdpa", "seq_len=16,32", "steps=2",
         "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000",
         f"hydra.sweep.dir={tmp_path}", f"cache_dir={tmp_path / 'cache'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = sorted(p.name for p in tmp_path.iterdir() if (p / SUMMARY_FILE).exists())
    names = sorted(j.split("-", 1)[1] for j in jobs)
    assert names == ["naive-tiny-n16", "naive-tiny-n32", "sdpa-tiny-n16", "sdpa-tiny-n32"]
    assert sorted(j.split("-", 1)[0] for j in jobs) == ["0", "1", "2", "3"]
    for job in jobs:
        assert json.loads((tmp_path / job / SUMMARY_FILE).read_text())["status"] == "ok"


def test_attention_share_counts_each_step_once_on_cuda():
    """On CUDA the profiler lists every step twice (host span + GPU annotation with no CPU time); the
    H200 runs showed the per-step numbers halved before this was handled."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from training.profiling import attention_share

    def ev(name, cpu_us=0.0, gpu_us=0.0, device=DeviceType.CPU, parent=None):
        return SimpleNamespace(name=name, cpu_time_total=cpu_us, device_time_total=gpu_us, device_type=device,
                               cpu_parent=parent)

    steps = [ev(f"ProfilerStep#{i}", cpu_us=145_000) for i in (2, 3, 4)]
    twins = [ev(f"ProfilerStep#{i}", gpu_us=143_000, device=DeviceType.CUDA) for i in (2, 3, 4)]
    fwd = [ev("flashgpt::flash_attn_fwd", cpu_us=50, gpu_us=17_000, parent=s) for s in steps]
    bwd = [ev("flashgpt::flash_attn_bwd", cpu_us=60, gpu_us=50_000) for _ in steps]  # autograd thread: no parent
    sdpa = ev("aten::scaled_dot_product_attention", gpu_us=1_000, parent=steps[0])
    inner = ev("aten::_scaled_dot_product_cudnn_attention", gpu_us=1_000, parent=sdpa)  # inside sdpa: not again
    report = attention_share([*steps, *twins, *fwd, *bwd, sdpa, inner], on_gpu=True)
    assert report["steps_profiled"] == 3 and report["step_ms"] == pytest.approx(145.0)
    assert report["attention_ms"] == pytest.approx((3 * 67_000 + 1_000) / 3 / 1e3)
    assert report["attention_share"] == pytest.approx((3 * 67_000 + 1_000) / (3 * 145_000))
    assert set(report["attention_ops_ms"]) == {"flashgpt::flash_attn_fwd", "flashgpt::flash_attn_bwd",
                                               "aten::scaled_dot_product_attention"}
