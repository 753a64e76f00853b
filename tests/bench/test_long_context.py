"""bench/long_context.py and scripts/long_context.py: one real --quick point (a train.py process) into the
default output folder, rows from run folders (ok, oom, a process that died, a timeout), the sweep's skip
and continue rules with a stand-in runner, the plot."""

import json
from datetime import date

import pytest

from bench import long_context as lc
from bench.results import read_results
from scripts import long_context as script

OK = {"status": "ok", "final/tokens_per_s_median": 31_100.0, "final/step_ms_median": 2107.0, "final/peak_mem_gib": 78.4,
      "profile/attention_share": 0.61, "final/mfu_median": 0.35, "final/hfu_median": 0.41, "memory/estimated_gib": 95.0,
      "checkpointing": "none", "loss_chunk": 4096, "final/val_loss": 7.1}


def run_folder(tmp_path, name, summary=None, output=""):
    run = tmp_path / name
    run.mkdir()
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    (run / lc.OUTPUT_LOG).write_text(output)
    return run


@pytest.mark.slow
def test_a_quick_point_trains_in_its_own_process_and_lands_in_the_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # default outputs are relative to the current folder, never the repository
    assert script.main(["--quick", "--seq-lens", "64", "--checkpointing", "blocks"]) == 0
    out_dir = tmp_path / "outputs" / "bench" / date.today().isoformat() / "long_context"
    data = read_results(out_dir / "long_context.json")
    [row] = data["rows"]
    assert (row["attention"], row["seq_len"], row["checkpointing"], row["position"], row["status"]) == ("sdpa", 64, "blocks", "rope", "ok")
    assert row["tokens_per_s"] > 0 and row["step_ms"] > 0 and 0 < row["attention_share"] < 1 and row["estimated_gib"] > 0
    assert row["peak_mem_gib"] is None and row["hfu"] is None  # CPU: no GPU memory, no peak FLOP/s
    assert (out_dir / "long_context.png").exists() and (out_dir / "runs" / "sdpa-blocks-rope-n64" / "train.log").exists()
    assert "checkpointing=blocks: activation checkpointing on" in (out_dir / "runs" / "sdpa-blocks-rope-n64" / "train.log").read_text()
    assert data["meta"]["model"] == "tiny" and "device=cpu" in data["meta"]["train_overrides"]
    assert "64 / -" in capsys.readouterr().out  # the frontier line: trained at 64, no out-of-memory


def test_rows_from_run_folders(tmp_path):
    point = lc.Point("flash", 65536, "none", "rope")
    ok = lc.point_row(point, run_folder(tmp_path, "ok", OK), seconds=95.3)
    assert tuple(ok) == lc.ROW_KEYS
    assert (ok["status"], ok["tokens_per_s"], ok["peak_mem_gib"], ok["attention_share"], ok["hfu"], ok["estimated_gib"],
            ok["loss_chunk"]) == ("ok", 31_100, 78.4, 0.61, 0.41, 95.0, 4096)
    oom = lc.point_row(point, run_folder(tmp_path, "oom", {"status": "oom", "error": "CUDA out of memory (...)"}))
    assert oom["status"] == "oom" and oom["tokens_per_s"] is None and oom["note"] is None
    died = run_folder(tmp_path, "died", None, "...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 26.00 GiB\n")
    assert lc.point_row(point, died)["status"] == "oom"  # out of memory before the loop could write its summary
    crashed = lc.point_row(point, run_folder(tmp_path, "crashed", None, "Segmentation fault\n"))
    assert (crashed["status"], crashed["note"]) == ("error", "Segmentation fault")
    assert lc.point_row(point, run_folder(tmp_path, "slow", None, "step 1/5"), timed_out=True)["status"] == "timeout"
    failed = lc.point_row(point, run_folder(tmp_path, "failed", {"status": "error", "error": "RuntimeError('x')"}))
    assert (failed["status"], failed["note"]) == ("error", "RuntimeError('x')")


def test_each_point_is_one_long_context_train_run(tmp_path):
    args = script.parse_args(["--attention", "naive", "--seq-lens", "8192", "--train", "compile=false"])
    assert args.checkpointing == ["none", "blocks"] and args.position == ["rope"] and args.model == "gpt2-medium"
    assert args.out.parts[:2] == ("outputs", "bench") and args.plot.name == "long_context.png"
    cmd = lc.train_command(lc.points(args)[1], args, tmp_path / "run")
    assert cmd[1].endswith("train.py") and cmd[2] == "experiment=long-context"
    for override in ("attention=naive", "seq_len=8192", "batch_size=1", "checkpointing=blocks", "model.position=rope",
                     "data=synthetic", "profile=true", f"hydra.run.dir={tmp_path / 'run'}"):
        assert override in cmd, override
    assert cmd[-1] == "compile=false"  # the user's overrides come last and win
    quick = script.parse_args(["--quick"])
    assert quick.model == "tiny" and quick.seq_lens == [32, 64] and "device=cpu" in quick.overrides
    with pytest.raises(SystemExit):
        script.parse_args(["--steps", "3"])  # the profiler needs steps 3-5
    fast = script.parse_args(["--steps", "3", "--no-profile"])
    assert "profile=false" in lc.train_command(lc.points(fast)[0], fast, tmp_path)


def test_sweep_skips_past_an_oom_writes_every_point_and_continues(tmp_path, capsys):
    out = tmp_path / "lc.json"
    argv = ["--attention", "naive", "flash", "--checkpointing", "none", "--seq-lens", "8192", "16384", "32768",
            "--out", str(out), "--runs-dir", str(tmp_path / "runs")]
    ran = []

    def runner(point, args, run_dir):
        written = {(r["attention"], r["seq_len"]) for r in (read_results(out)["rows"] if out.exists() else [])}
        assert written >= {(name.split("-")[0], int(name.rsplit("-n", 1)[1])) for name in ran}  # every earlier point is on disk
        ran.append(point.name)
        fits = point.attention == "flash" or point.seq_len < 16384
        row = dict.fromkeys(lc.ROW_KEYS)
        row.update(attention=point.attention, seq_len=point.seq_len, checkpointing=point.checkpointing,
                   position=point.position, status="ok" if fits else "oom", tokens_per_s=1e5 / point.seq_len * 1e3,
                   peak_mem_gib=point.seq_len / 1e3, run_dir=str(run_dir))
        return row

    meta = {"convention": lc.CONVENTION}
    rows = lc.sweep(script.parse_args(argv), meta, runner)
    assert ran == ["naive-none-rope-n8192", "naive-none-rope-n16384", "flash-none-rope-n8192", "flash-none-rope-n16384",
                   "flash-none-rope-n32768"]
    assert [(r["attention"], r["seq_len"], r["status"]) for r in rows] == [
        ("naive", 8192, "ok"), ("naive", 16384, "oom"), ("naive", 32768, "skipped"),
        ("flash", 8192, "ok"), ("flash", 16384, "ok"), ("flash", 32768, "ok")]
    assert "16384 of this line already ran out of memory" in rows[2]["note"]
    assert read_results(out) == {"meta": {**meta, "commands": [None]}, "rows": rows}
    assert lc.frontier(rows)[0] == {"attention": "naive", "checkpointing": "none", "position": "rope",
                                    "longest_ok": 8192, "first_oom": 16384}

    ran.clear()  # the same command again: nothing to measure; a new line is added to the same file
    assert lc.sweep(script.parse_args(argv), meta, runner) == rows and ran == []
    more = lc.sweep(script.parse_args([*argv, "--checkpointing", "blocks", "--attention", "flash"]), meta, runner)
    assert len(more) == 9 and len(ran) == 3
    assert "keeping 5 measured point(s)" in capsys.readouterr().out
    assert read_results(out)["meta"]["commands"] == [None, None, None]  # one per piece of the sweep
    ran.clear()
    redone = lc.sweep(script.parse_args([*argv, "--redo", "--attention", "flash"]), meta, runner)
    assert len(ran) == 3 and len(redone) == 9  # the other lines' rows stay


def test_plot_has_a_line_per_attention_and_checkpointing(tmp_path):
    rows = []
    for attn in ("naive", "flash"):
        for ckpt in ("none", "blocks"):
            for n, status in ((8192, "ok"), (16384, "ok" if attn == "flash" else "oom")):
                rows.append({"attention": attn, "checkpointing": ckpt, "position": "rope", "seq_len": n, "status": status,
                             "peak_mem_gib": n / 1000, "tokens_per_s": 1e9 / n})
    path = script.plot_long_context(rows, tmp_path / "lc.png", gpu_memory_gib=139.7)
    assert path.stat().st_size > 10_000
    assert "skipped" in lc.render([{**rows[0], **dict.fromkeys(lc.ROW_KEYS[5:]), "status": "skipped"}])
