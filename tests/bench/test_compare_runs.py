"""scripts/compare_runs.py and bench/runs.py: reading run folders (a real tiny train() run and hand-made
ok/oom/killed/failed ones), the JSON rows, the printed tables and the plot."""

import os
import time

import pytest
from _fake_runs import OK, fake_run
from omegaconf import OmegaConf

from bench.results import read_results
from bench.runs import ROW_KEYS, collect
from scripts import compare_runs
from training.loop import train
from training.metrics import attention_label

# the run label of SDPA pinned to cuDNN, as the trainer names it
SDPA_CUDNN = attention_label(OmegaConf.create({"attention": {"name": "sdpa", "backend": "cudnn"}}))


def test_sweep_folder_with_ok_oom_killed_and_failed_runs(tmp_path, capsys):
    sweep = tmp_path / "multirun" / "2026-11-29" / "15-00-00"
    fake_run(sweep, "0-naive-n1024", "naive", 1024, {**OK, "perf/tokens_per_s": 58_600.0})
    fake_run(sweep, "1-naive-n8192", "naive", 8192, {"status": "oom", "error": "CUDA out of memory"}, steps=0)
    fake_run(sweep, "2-flash-n8192", "flash", 8192, OK)
    fake_run(sweep, "3-sdpa-n8192", "sdpa", 8192, None, steps=5)  # killed mid-run
    fake_run(sweep, "4-sdpa-n1024", "sdpa", 1024, None, steps=0, backend="cudnn")  # config error: nothing logged
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    out = tmp_path / "train_sweep.json"
    rows = compare_runs.main([str(sweep), "--out", str(out), "--plot", str(tmp_path / "sweep.png")])

    data = read_results(out)
    assert data["rows"] == rows and {"gpu", "torch", "date", "git_rev", "convention"} <= set(data["meta"])
    assert all(tuple(r) == ROW_KEYS for r in rows)
    got = {(r["attention"], r["seq_len"]): r for r in rows}
    assert set(got) == {("naive", 1024), ("naive", 8192), ("flash", 8192), ("sdpa", 8192), (SDPA_CUDNN, 1024)}
    assert got["flash", 8192]["tokens_per_s"] == 125_700 and got["flash", 8192]["final_loss"] == 3.21
    assert got["flash", 8192]["mfu"] == 0.41 and got["flash", 8192]["status"] == "ok"
    assert got["naive", 8192]["status"] == "oom" and got["naive", 8192]["tokens_per_s"] is None
    assert got["sdpa", 8192]["status"] == "incomplete" and got[SDPA_CUDNN, 1024]["status"] == "error"
    assert [(r["seq_len"], r["attention"]) for r in rows][:2] == [(1024, "naive"), (1024, SDPA_CUDNN)]
    printed = capsys.readouterr().out
    assert "125,700" in printed and "oom" in printed and "MFU %" in printed
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


def test_pivot_puts_attention_in_columns_and_status_where_no_number():
    rows = [dict(model="m", seq_len=1024, attention="flash", tokens_per_s=125_700.0, status="ok"),
            dict(model="m", seq_len=1024, attention="naive", tokens_per_s=None, status="oom"),
            dict(model="m", seq_len=2048, attention="flash", tokens_per_s=60_000.0, status="ok")]
    lines = compare_runs.pivot(rows).splitlines()
    assert lines[0].split()[-2:] == ["naive", "flash"]  # the README's order
    assert lines[2].split()[-2:] == ["oom", "125,700"] and lines[3].split()[-1] == "60,000"


def test_newest_of_repeated_runs_wins(tmp_path):
    old = fake_run(tmp_path / "a", "run", "flash", 1024, {**OK, "status": "oom"})
    new = fake_run(tmp_path / "b", "run", "flash", 1024, OK)
    past = time.time() - 100
    for p in old.iterdir():
        os.utime(p, (past, past))
    [row] = collect([tmp_path])
    assert row["status"] == "ok" and row["run_dir"] == str(new)


def test_missing_folder_and_empty_sweep_fail_with_a_message(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        compare_runs.main([str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match="no training runs"):
        compare_runs.main([str(tmp_path), "--no-plot"])


def test_reads_a_real_training_run(tiny_cfg, pattern_data, tmp_path):
    # train() as the -m sweep runs it; Hydra would also save the composed config in .hydra/.
    cfg = tiny_cfg("attention=naive")
    summary = train(cfg)
    run = tmp_path / "run"
    (run / ".hydra").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml", resolve=True)
    [row] = compare_runs.main([str(tmp_path), "--out", str(tmp_path / "s.json"), "--no-plot"])
    assert row["attention"] == "naive" and row["seq_len"] == cfg.seq_len and row["model"] == cfg.model.name
    assert row["status"] == "ok" and row["tokens_per_s"] == pytest.approx(summary["perf/tokens_per_s"], rel=1e-4)
    assert row["final_loss"] == pytest.approx(summary["final/val_loss"], rel=1e-4)
