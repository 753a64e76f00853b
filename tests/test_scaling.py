"""scripts/scaling.py: launching 1 process and 2 torchrun ranks (gloo, CPU, tiny model), then the report's
rows, scaling efficiency and JSON; and the run specs users type."""

import argparse
import json

import pytest

import kernels  # noqa: F401 - first, so the Triton backend is chosen before anything imports triton
from conftest import SHRINK
from scripts import scaling
from scripts._common import read_results

# train.py overrides after `--`: the tiny CPU model of the other tests, sdpa (no interpreter cost).
TINY = [o for o in SHRINK if not o.startswith(("batch_size", "steps"))] + ["data=synthetic"]


def test_run_specs():
    assert scaling.RunSpec.parse("flash:2:fsdp") == scaling.RunSpec("flash", 2, "fsdp")
    assert scaling.RunSpec.parse("sdpa:1").name == "sdpa-1gpu"
    assert scaling.RunSpec.parse("sdpa:4").name == "sdpa-ddp-4gpu"
    for bad in ("flash", "flash:0", "flash:two", "flash:2:zero3", "a:1:ddp:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="attention:gpus|parallel must be"):
            scaling.RunSpec.parse(bad)


def test_more_gpus_than_the_machine_has_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="16 GPUs asked for"):
        scaling.main(["run", "flash:16", "--runs-dir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []


def test_one_process_and_two_ranks_then_the_report(tmp_path, capsys):
    runs = tmp_path / "runs"
    rc = scaling.main(["run", "sdpa:1", "sdpa:2", "sdpa:2:fsdp", "--runs-dir", str(runs), "--model", "tiny",
                       "--seq-len", "32", "--per-gpu-batch", "2", "--steps", "3", "--",
                       *TINY, f"cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    out = tmp_path / "scaling.json"
    rows = scaling.main(["report", str(runs), "--out", str(out)])
    got = {(r["gpus"], r["parallel"]): r for r in rows}
    assert set(got) == {(1, "single"), (2, "ddp"), (2, "fsdp")}
    for r in rows:
        assert tuple(r) == scaling.ROW_KEYS and r["status"] == "ok" and r["per_gpu_batch"] == 2
        assert r["tokens_per_s"] == pytest.approx(r["gpus"] * r["tokens_per_s_per_gpu"], rel=1e-4)
        # the efficiency is the ratio it claims to be, against the 1-process run
        expected = r["tokens_per_s"] / (r["gpus"] * got[1, "single"]["tokens_per_s"])
        assert r["scaling_efficiency"] == pytest.approx(expected, rel=1e-3)
    assert got[1, "single"]["scaling_efficiency"] == 1.0
    # the 2-rank runs stepped twice the batch: the trainer's summary counted both ranks
    launched = json.loads((runs / "sdpa-fsdp-2gpu" / scaling.LAUNCH_FILE).read_text())
    assert launched["gpus"] == 2 and "--nproc_per_node=2" in launched["command"]
    assert "batch_size=4" in launched["command"] and "parallel=fsdp" in launched["command"]
    data = read_results(out)
    assert data["rows"] == rows and "scaling_efficiency" in data["meta"]["convention"]
    assert "| sdpa | fsdp | 2 |" in data["markdown"]
    assert "scaling %" in capsys.readouterr().out


def test_a_run_that_died_is_reported_with_its_gpu_count(tmp_path):
    runs = tmp_path / "runs"
    # train.py refuses the config (a bad attention name): the run folder holds the launch record only
    # ... plus Hydra's config, which train.py writes before validating.
    rc = scaling.main(["run", "sdpa:1", "--runs-dir", str(runs), "--model", "tiny", "--seq-len", "32",
                       "--steps", "2", "--", *TINY, "lr=-1", f"cache_dir={tmp_path / 'cache'}"])
    assert rc == 1
    rows = scaling.main(["report", str(runs), "--out", str(tmp_path / "s.json")])
    assert [(r["gpus"], r["status"], r["tokens_per_s"], r["scaling_efficiency"]) for r in rows] == [(1, "error", None, None)]
