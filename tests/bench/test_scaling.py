"""scripts/scaling.py: the run specs and pass-through args users type, the report on hand-made runs,
then launching 1 process and 2 torchrun ranks for real (gloo, CPU, tiny model)."""

import argparse
import json

import pytest
from _fake_runs import OK, fake_run
from conftest import SHRINK

from bench.results import read_results
from scripts import scaling

# train.py overrides after --train: the tiny CPU model of the other tests, sdpa (no interpreter cost).
TINY = [o for o in SHRINK if not o.startswith(("batch_size", "steps"))] + ["data=synthetic"]


def test_run_specs():
    assert scaling.RunSpec.parse("flash:2:fsdp") == scaling.RunSpec("flash", 2, "fsdp")
    assert scaling.RunSpec.parse("sdpa:1").name == "sdpa-1gpu"
    assert scaling.RunSpec.parse("sdpa:4").name == "sdpa-ddp-4gpu"
    for bad in ("flash", "flash:0", "flash:two", "flash:2:zero3", "a:1:ddp:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="attention:gpus|parallel must be"):
            scaling.RunSpec.parse(bad)


@pytest.mark.parametrize("marker", ["--train", "--"])
def test_everything_after_the_marker_goes_to_train_py(marker):
    args = scaling.parse_args(["run", "flash:1", "sdpa:2", "--steps", "3", marker, "device=cpu", "--cfg", "job", "steps=9"])
    assert args.runs == [scaling.RunSpec("flash", 1), scaling.RunSpec("sdpa", 2)] and args.steps == 3
    assert args.overrides == ["device=cpu", "--cfg", "job", "steps=9"]
    cmd = scaling.command(args.runs[1], args, args.runs_dir / "x")
    assert cmd[-4:] == ["device=cpu", "--cfg", "job", "steps=9"] and "--nproc_per_node=2" in cmd and "batch_size=4" in cmd
    assert scaling.parse_args(["run", "flash:1"]).overrides == []
    assert scaling.parse_args(["run", "flash:1"]).runs_dir.parts[:2] == ("outputs", "bench")


def test_more_gpus_than_the_machine_has_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="16 GPUs asked for"):
        scaling.main(["run", "flash:16", "--runs-dir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []


def test_report_rows_and_efficiency_from_run_folders(tmp_path, capsys):
    runs = tmp_path / "runs"
    fake_run(runs, "flash-1gpu", "flash", 8192, OK, parallel="ddp", batch_size=2)
    fake_run(runs, "flash-ddp-2gpu", "flash", 8192, {**OK, "ranks": 2, "final/tokens_per_s_median": 226_260.0}, parallel="ddp", batch_size=4)
    died = fake_run(runs, "flash-fsdp-2gpu", "flash", 8192, None, steps=0, parallel="fsdp", batch_size=4)
    (died / scaling.LAUNCH_FILE).write_text(json.dumps({"gpus": 2, "parallel": "fsdp", "command": []}))
    out = tmp_path / "scaling.json"
    rows = scaling.main(["report", str(runs), "--out", str(out)])
    got = {(r["gpus"], r["parallel"]): r for r in rows}
    assert set(got) == {(1, "single"), (2, "ddp"), (2, "fsdp")} and all(tuple(r) == scaling.ROW_KEYS for r in rows)
    assert got[1, "single"]["scaling_efficiency"] == 1.0 and got[2, "ddp"]["scaling_efficiency"] == 0.9
    assert got[2, "ddp"]["tokens_per_s_per_gpu"] == 113_130 and got[2, "ddp"]["per_gpu_batch"] == 2
    assert (got[2, "fsdp"]["status"], got[2, "fsdp"]["scaling_efficiency"]) == ("error", None)  # its GPU count from launch.json
    data = read_results(out)
    assert data["rows"] == rows and "scaling_efficiency" in data["meta"]["convention"]
    assert "| flash" in data["markdown"] and "90.0" in data["markdown"]
    assert "scaling %" in capsys.readouterr().out


@pytest.mark.slow
def test_one_process_and_two_ranks_then_the_report(tmp_path):
    runs = tmp_path / "runs"
    rc = scaling.main(["run", "sdpa:1", "sdpa:2", "sdpa:2:fsdp", "--runs-dir", str(runs), "--model", "tiny",
                       "--seq-len", "32", "--per-gpu-batch", "2", "--steps", "3", "--train",
                       *TINY, f"cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    rows = scaling.main(["report", str(runs), "--out", str(tmp_path / "scaling.json")])
    got = {(r["gpus"], r["parallel"]): r for r in rows}
    assert set(got) == {(1, "single"), (2, "ddp"), (2, "fsdp")}
    for r in rows:
        assert r["status"] == "ok" and r["per_gpu_batch"] == 2
        assert r["tokens_per_s"] == pytest.approx(r["gpus"] * r["tokens_per_s_per_gpu"], rel=1e-4)
        # the efficiency is the ratio it claims to be, against the 1-process run
        expected = r["tokens_per_s"] / (r["gpus"] * got[1, "single"]["tokens_per_s"])
        assert r["scaling_efficiency"] == pytest.approx(expected, rel=1e-3)
    # the 2-rank runs stepped twice the batch: the trainer's summary counted both ranks
    launched = json.loads((runs / "sdpa-fsdp-2gpu" / scaling.LAUNCH_FILE).read_text())
    assert launched["gpus"] == 2 and "--nproc_per_node=2" in launched["command"]
    assert "batch_size=4" in launched["command"] and "parallel=fsdp" in launched["command"]


@pytest.mark.slow
def test_a_run_that_died_is_reported_with_its_gpu_count(tmp_path):
    runs = tmp_path / "runs"
    # train.py refuses the config (a bad learning rate): the run folder holds the launch record
    # ... plus Hydra's config, which train.py writes before validating.
    rc = scaling.main(["run", "sdpa:1", "--runs-dir", str(runs), "--model", "tiny", "--seq-len", "32",
                       "--steps", "2", "--", *TINY, "lr=-1", f"cache_dir={tmp_path / 'cache'}"])
    assert rc == 1
    rows = scaling.main(["report", str(runs), "--out", str(tmp_path / "s.json")])
    assert [(r["gpus"], r["status"], r["tokens_per_s"], r["scaling_efficiency"]) for r in rows] == [(1, "error", None, None)]
