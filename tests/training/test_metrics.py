"""training/metrics.py: metrics.jsonl and summary.json written whole and read back, run labels, wandb
disabled (what an offline wandb run holds: test_wandb_run.py)."""

import json
import logging
from pathlib import Path

import pytest
from _tiny import read_metrics
from conftest import compose_config

from data.files import atomic_path
from training import train
from training.metrics import (
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsLogger,
    NoMetrics,
    attention_label,
    read_jsonl,
    run_name,
)


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
        # Unbuffered: a reader (or a SIGKILL) sees the whole line before log() returns. The row gains
        # the tokens so far (3 steps × batch 4 × seq_len 32) and the seconds since the logger started.
        last = json.loads((out / METRICS_FILE).read_text().splitlines()[-1])
        assert last == {"step": 3, "train/loss": 3.0, "train/tokens": 3 * 4 * 32, "time/elapsed_s": last["time/elapsed_s"]}
        assert 0 <= last["time/elapsed_s"] < 5
        logger.finish({"status": "ok"})
        records = read_jsonl(out / METRICS_FILE)
    assert records == [*whole, last, {"summary": {"status": "ok"}}]
    assert "skipped 1 unreadable line(s)" in caplog.text and "line [3]" in caplog.text
    assert json.loads((out / SUMMARY_FILE).read_text()) == {"status": "ok"}
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


def test_summary_is_replaced_whole_or_not_at_all(tmp_path, tiny_cfg, monkeypatch):
    out = tmp_path / "run"
    first = MetricsLogger(tiny_cfg(), out, derived={})
    first.finish({"status": "ok", "final/val_loss": 3.5})
    assert json.loads((out / SUMMARY_FILE).read_text()) == {"status": "ok", "final/val_loss": 3.5}

    def crash(path, data):  # the disk fills while the new summary is half written
        with atomic_path(path) as tmp:
            tmp.write_text(data[: len(data) // 2])
            raise OSError("disk full")

    monkeypatch.setattr("training.metrics.atomic_write", crash)
    second = MetricsLogger(tiny_cfg(), out, derived={})
    with pytest.raises(OSError, match="disk full"):
        second.finish({"status": "oom", "error": "CUDA out of memory"})
    assert json.loads((out / SUMMARY_FILE).read_text()) == {"status": "ok", "final/val_loss": 3.5}  # the old one, whole
    assert sorted(p.name for p in out.iterdir()) == [METRICS_FILE, SUMMARY_FILE]  # no temporary left behind
    assert [r["summary"]["status"] for r in read_jsonl(out / METRICS_FILE)] == ["ok", "oom"]  # the log has both


@pytest.mark.parametrize(
    "overrides, label",
    [
        (["attention=naive"], "naive"),
        (["attention=sdpa"], "sdpa"),
        (["attention=sdpa", "attention.backend=cudnn"], "sdpa_cudnn"),
        (["attention=flash"], "flash"),
        (["attention=flash", "attention.deterministic=true"], "flash_two_pass"),
    ],
)
def test_attention_label_names_each_variant_once(overrides, label):
    """The benchmarks (scripts/) call the variants by these names too."""
    cfg = compose_config(*overrides, "model=tiny", "seq_len=64")
    assert attention_label(cfg) == label and run_name(cfg) == f"{label}-tiny-n64"


def test_ranks_other_than_0_write_nothing(tmp_path):
    metrics = NoMetrics()
    metrics.log(1, {"train/loss": 1.0})
    metrics.finish({"status": "ok"})
    assert list(tmp_path.iterdir()) == []


def test_wandb_disabled_still_writes_metrics(tiny_cfg, pattern_data):
    cfg = tiny_cfg("attention=sdpa", "steps=2", "logger=wandb", "logger.mode=disabled")
    assert train(cfg)["status"] == "ok"
    assert not (Path(cfg.out_dir) / "wandb").exists()
    assert len(read_metrics(Path(cfg.out_dir))[0]) == 2
