"""scripts/compare_runs.py and bench/runs.py: reading run folders (a real tiny train() run and hand-made
ok/oom/killed/failed ones), the JSON rows, the printed tables and the plot."""

import os
import time

import pytest
from _fake_runs import OK, fake_run
from omegaconf import OmegaConf

from bench import plots
from bench.results import read_results
from bench.runs import ROW_KEYS, attention_rank, collect, loss_curve
from scripts import compare_runs
from training.loop import train
from training.metrics import attention_label

# the run label of SDPA pinned to cuDNN, as the trainer names it
SDPA_CUDNN = attention_label(OmegaConf.create({"attention": {"name": "sdpa", "backend": "cudnn"}}))


def test_sweep_folder_with_ok_oom_killed_and_failed_runs(tmp_path, capsys):
    sweep = tmp_path / "multirun" / "2026-11-29" / "15-00-00"
    fake_run(sweep, "0-naive-n1024", "naive", 1024, {**OK, "final/tokens_per_s_median": 58_600.0})
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


def age(run, seconds):
    """Make a fake run folder look `seconds` older."""
    past = time.time() - seconds
    for p in run.iterdir():
        os.utime(p, (past, past))
    return run


def test_newest_of_repeated_runs_wins_among_equals(tmp_path):
    age(fake_run(tmp_path / "a", "run", "flash", 1024, OK), 100)
    new = fake_run(tmp_path / "b", "run", "flash", 1024, {**OK, "final/tokens_per_s_median": 130_000.0})
    [row], aside = collect([tmp_path])
    assert row["run_dir"] == str(new) and row["tokens_per_s"] == 130_000 and len(aside) == 1


def test_a_finished_run_is_shown_over_newer_unfinished_ones_and_all_are_listed_on_request(tmp_path, capsys):
    good = age(fake_run(tmp_path / "a", "run", "flash", 1024, OK), 300)
    age(fake_run(tmp_path / "b", "run", "flash", 1024, {"status": "oom"}), 200)
    fake_run(tmp_path / "c", "run", "flash", 1024, None, steps=0)  # newest: a config error, nothing logged
    fake_run(tmp_path / "d", "run", "flash", 1024, None, steps=4)  # killed
    rows, aside = collect([tmp_path])
    assert [r["run_dir"] for r in rows] == [str(good)]
    assert sorted(r["status"] for r in aside) == ["error", "incomplete", "oom"]
    compare_runs.main([str(tmp_path), "--out", str(tmp_path / "s.json"), "--no-plot"])
    printed = capsys.readouterr().out
    line = "set aside 3 repeated run(s) of a configuration shown above (1 error, 1 incomplete, 1 oom)"
    assert printed.count(line) == 1 and "--all lists them" in printed and str(tmp_path / "c") not in printed
    compare_runs.main([str(tmp_path), "--out", str(tmp_path / "s.json"), "--no-plot", "--all"])
    printed = capsys.readouterr().out
    assert all(str(tmp_path / x / "run") in printed for x in "bcd")
    assert len(read_results(tmp_path / "s.json")["set_aside"]) == 3


def test_attention_order_puts_variants_after_their_base():
    labels = ["flash_two_pass", "sdpa_cudnn", "flash", "naive", "sdpa", "custom"]
    assert sorted(labels, key=attention_rank) == ["naive", "sdpa", "sdpa_cudnn", "flash", "flash_two_pass", "custom"]


def test_old_summary_names_are_read_under_the_new_ones(tmp_path):
    old = {"status": "ok", "perf/tokens_per_s": 125_700.0, "perf/step_ms": 130.3, "perf/peak_mem_gib": 40.5,
           "perf/mfu": 0.41, "final/val_loss": 3.21}  # a run folder from before the final/* names
    fake_run(tmp_path, "old", "flash", 1024, old)
    [row], _ = collect([tmp_path])
    assert (row["tokens_per_s"], row["step_ms"], row["peak_mem_gib"], row["mfu"]) == (125_700, 130.3, 40.5, 0.41)


def test_plot_has_loss_curves_and_no_empty_memory_panel(tmp_path, monkeypatch):
    cpu = {**OK, "final/peak_mem_gib": None}
    runs = [fake_run(tmp_path, f"{a}-{n}", a, n, cpu, steps=4, batch_size=2) for a in ("flash", "naive") for n in (64, 128)]
    rows, _ = collect([tmp_path])
    assert [(r["attention"], r["seq_len"]) for r in rows] == [("naive", 64), ("flash", 64), ("naive", 128), ("flash", 128)]
    curves = loss_curve(runs[0])
    assert curves["train"] == [(2 * 64 * (i + 1), 5.0 - i) for i in range(4)]  # tokens from step × batch × seq_len
    panels = []
    real = plots.pyplot

    def spy():
        plt = real()
        subplots = plt.subplots
        plt.subplots = lambda *a, **k: panels.append(a) or subplots(*a, **k)
        return plt

    monkeypatch.setattr(plots, "pyplot", spy)
    path = plots.plot_train_sweep(rows, tmp_path / "sweep.png")
    assert panels == [(1, 2)] and path.stat().st_size > 10_000  # tokens/s and the losses; no memory panel on CPU


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
    assert row["status"] == "ok" and row["tokens_per_s"] == pytest.approx(summary["final/tokens_per_s_median"], rel=1e-4)
    assert row["final_loss"] == pytest.approx(summary["final/val_loss"], rel=1e-4)
