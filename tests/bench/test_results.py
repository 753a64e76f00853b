"""bench/results.py: what every result file carries, where it goes by default, atomic JSON."""

import json
import math
from datetime import date
from pathlib import Path

import pytest
import torch

from bench import results

CPU = torch.device("cpu")


def test_run_meta_has_machine_versions_and_conventions():
    meta = results.run_meta(CPU, "some convention", extra_key=1)
    for key in ("gpu", "torch", "triton", "cuda", "date", "git_rev", "convention", "timer", "command"):
        assert key in meta
    assert meta["torch"] == torch.__version__ and meta["convention"] == "some convention" and meta["extra_key"] == 1
    assert meta["git_rev"] != ""
    json.dumps(meta)  # must be serialisable as is


def test_write_results_round_trip_and_refuses_nan(tmp_path):
    path = tmp_path / "sub" / "r.json"
    results.write_results(path, {"gpu": "x"}, [{"a": 1, "b": None}], extra=[1, 2])
    assert results.read_results(path) == {"meta": {"gpu": "x"}, "rows": [{"a": 1, "b": None}], "extra": [1, 2]}
    with pytest.raises(ValueError):  # NaN is not JSON; measurements that do not exist are None
        results.write_results(path, {}, [{"a": math.nan}])
    assert results.read_results(path)["rows"] == [{"a": 1, "b": None}]  # the failed write left the old file
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # and no temporary file


def test_default_outputs_are_dated_per_script_outside_the_tree():
    out = results.default_out("bench_attention", "attention_bench.json")
    assert out == Path("outputs", "bench", date.today().isoformat(), "bench_attention", "attention_bench.json")
    assert not out.is_absolute()  # relative to where the script runs, like Hydra's outputs/


def test_rounded_keeps_significant_digits():
    assert results.rounded(None) is None
    assert results.rounded(123456.789) == 123460.0
    assert results.rounded(0.000123456789) == 0.00012346
