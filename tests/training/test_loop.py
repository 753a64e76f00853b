"""training/loop.py: train_step, evaluate, the loop end to end, and what it does with NaN/Inf and OOM."""

import json
import logging
from pathlib import Path

import pytest
import torch
from _tiny import CPU, no_autocast, read_metrics
from conftest import PatternDataset

from model import GPT, GPTConfig
from training import train
from training.batches import get_batch
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from training.loop import NonFiniteStep, evaluate, train_step
from training.metrics import METRICS_FILE, SUMMARY_FILE, read_jsonl
from training.optim import build_optimizer


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


def test_evaluate_reads_the_same_val_batches_every_time():
    ds = PatternDataset(seq_len=16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(1, 2, 32, 48, 16))
    first = evaluate(model, ds, eval_steps=3, batch_size=2, device=CPU, autocast=no_autocast)
    assert first == evaluate(model, ds, eval_steps=3, batch_size=2, device=CPU, autocast=no_autocast)
    assert model.training  # evaluate() puts train mode back
    x, _ = get_batch(ds, "val", 2, 0, CPU)
    assert x.shape == (2, 16) and x.device == CPU


@pytest.mark.parametrize("attention", ["naive", "sdpa", pytest.param("flash", marks=pytest.mark.slow)])
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
    assert flops["step"] == 0 and flops["flops/attn_bwd_executed"] >= 2 * flops["flops/attn_fwd_executed"] > 0
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert {"train/loss", "lr", "perf/step_ms", "perf/tokens_per_s", "perf/mfu", "time/elapsed_s"} <= r.keys()
        assert r["perf/tokens_per_s"] == pytest.approx(4 * 32 / (r["perf/step_ms"] / 1e3))
        assert r["train/tokens"] == r["step"] * 4 * 32
    assert [r["step"] for r in rows if "val/loss" in r] == [2, 4]
    assert summaries == [summary] == [json.loads((out / SUMMARY_FILE).read_text())]
    assert summary["status"] == "ok" and summary["final/train_loss"] == rows[-1]["train/loss"]
    assert 0 < summary["final/mfu_median"] < 1 and "final/peak_mem_gib" not in summary  # no GPU memory on CPU
    # the run's aggregates are named apart from the per-step values (one step's number is not the run's)
    assert not any(key.startswith("perf/") for key in summary)


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

        def poisoned(self, idx, targets=None, positions=None):
            logits, loss = forward(self, idx, targets, positions)
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


def test_stop_at_is_stopped_with_the_resume_hint_and_no_stale_val_loss(tiny_cfg, pattern_data, caplog):
    """stop_at=3 with evaluations every 2 steps: status stopped, no val loss from step 2 called final,
    and stopping adds no evaluation, so stop + resume logs what one straight run logs."""
    cfg = tiny_cfg("attention=sdpa", "stop_at=3", "eval_every=2", "ckpt_every=5")
    with caplog.at_level(logging.INFO):
        summary = train(cfg)
    out = Path(cfg.out_dir)
    assert summary["status"] == "stopped" and summary["steps_done"] == 3 and "final/val_loss" not in summary
    assert (f"stop_at=3: stopped after step 3; checkpoint saved in {out}. "
            f"Continue with resume={out} stop_at=null (or a later step)") in caplog.text
    assert "config:" not in caplog.text and (out / "resolved_config.yaml").exists()  # the full config: in the folder
    assert train(tiny_cfg("attention=sdpa", "eval_every=2", "ckpt_every=5", "resume=true"))["status"] == "ok"
    rows = read_jsonl(out / METRICS_FILE)
    assert [r["step"] for r in rows if "val/loss" in r] == [2, 4, 6]
