"""training/ under failure: torn metrics lines, bad checkpoints, NaN/Inf steps, signals, OOM.

Each test provokes one failure mode and checks what the user is left with: the message, the exit
code, and that checkpoints and metrics on disk are still whole and usable.
"""

import json
import logging
from pathlib import Path

from omegaconf import OmegaConf

from scripts.compare_runs import read_summary
from training.metrics import METRICS_FILE, SUMMARY_FILE, MetricsLogger, read_jsonl


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
    # scripts/compare_runs.py reads the same file through read_jsonl
    assert read_summary(out) == ({"status": "ok"}, 3)
    (out / METRICS_FILE).write_text(json.dumps(whole[0]) + "\n" + '{"summary": {"sta')  # killed while finishing
    assert read_summary(out) == ({"status": "ok"}, 1)  # falls back to summary.json
