"""train.py: exit codes and one-line errors, OOM alone and in a -m sweep, a sweep's folders."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, SHRINK, compose_config
from hydra.errors import ConfigCompositionException

from training.metrics import SUMMARY_FILE


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        ("seq_len=0", "config error: seq_len must be a positive integer (got 0)"),  # training/config.py's check
        ("lr=abc", "config error: Error merging override lr=abc (lr: Value 'abc' of type 'str' could not be "
                   "converted to Float)"),  # the schema's type, checked by Hydra while composing
    ],
)
def test_cli_config_error_is_one_line(tmp_path, override, message):
    """Through train.py: exit code 2, the field named, no traceback, before any data or model work."""
    result = subprocess.run(
        [sys.executable, "train.py", override, f"hydra.run.dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert message in output and len([line for line in output.splitlines() if "error" in line]) == 1
    assert "Traceback" not in output
    assert not (tmp_path / "cache").exists()  # failed before touching the data
    assert not (tmp_path / "run").exists()  # and left no run folder behind


@pytest.mark.parametrize(
    "override, message",
    [
        ("lr=abc", "Error merging override lr=abc (lr: Value 'abc' of type 'str' could not be converted to Float)"),
        ("model.n_layer=two", "Error merging override model.n_layer=two (model.n_layer: Value 'two' of type 'str' "
                              "could not be converted to Integer)"),
        ("model.dropout=some", "Error merging override model.dropout=some (model.dropout: Value 'some' of type 'str' "
                               "could not be converted to Float)"),
        ("seq_length=64", "Could not override 'seq_length'. To append to your config use +seq_length=64 "
                          "(seq_length: Key 'seq_length' not in 'TrainConfig')"),
        ("attention=flashy", "In 'config': Could not find 'attention/flashy'; Available options in 'attention': "
                             "flash naive sdpa"),
    ],
)
def test_a_config_hydra_cannot_compose_is_one_line_naming_the_field(override, message):
    import train as entry  # train.py

    with pytest.raises(ConfigCompositionException) as err:
        compose_config(override)
    assert entry.composition_error(err.value) == message


def numeric_fields() -> list[str]:
    """Every int or float key of the top-level schema and the model's, e.g. lr, peak_tflops, model.dropout."""
    import typing
    from dataclasses import fields

    from training.schema import Model, TrainConfig

    def numeric(cls: type) -> list[str]:
        hints = typing.get_type_hints(cls)
        return [f.name for f in fields(cls) if {int, float} & set(typing.get_args(hints[f.name]) or [hints[f.name]])]

    return numeric(TrainConfig) + [f"model.{name}" for name in numeric(Model)]


def test_every_numeric_field_is_typed_by_the_schema():
    """What Hydra checks while composing: a word in any int/float field is refused, naming the field."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    from training.schema import Model, TrainConfig

    keys = numeric_fields()
    assert {"lr", "min_lr", "weight_decay", "grad_clip", "beta1", "beta2", "peak_tflops", "steps", "stop_at",
            "dist_timeout_s", "model.dropout", "model.vocab_size"} <= set(keys)
    schema = OmegaConf.structured(TrainConfig(model=Model()))
    for key in keys:
        with pytest.raises(ValidationError, match="Value 'abc' of type 'str' could not be converted") as err:
            OmegaConf.update(schema, key, "abc")
        assert err.value.full_key == key


@pytest.mark.parametrize("key", ["peak_tflops", "beta1", "min_lr"])
def test_a_word_in_a_numeric_field_is_one_line_naming_it(key):
    """Through train.py's composition (Hydra, then composition_error): one line, exit code 2 in __main__."""
    import train as entry  # train.py

    with pytest.raises(ConfigCompositionException) as err:
        compose_config(f"{key}=abc")
    line = entry.composition_error(err.value)
    assert line.startswith(f"Error merging override {key}=abc ({key}: Value 'abc' of type 'str' could not be converted"), line
    assert "\n" not in line


def test_a_refused_config_leaves_no_run_folder_but_a_resumed_one_is_kept(tmp_path):
    import train as entry  # train.py

    refused, resumed = tmp_path / "refused", tmp_path / "resumed"
    for folder in (refused, resumed):
        (folder / ".hydra").mkdir(parents=True)
        (folder / "train.log").write_text("[00:00:00] config error: ...\n")
    (resumed / "checkpoint.pt").write_bytes(b"weights")
    entry.remove_unused_run_folder(refused)
    entry.remove_unused_run_folder(resumed)
    assert not refused.exists() and (resumed / "checkpoint.pt").exists()


def test_help_lists_groups_and_keys_with_their_comments_quickly():
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert time.perf_counter() - start < 10  # no torch import: well under a second on an idle machine
    out = result.stdout
    assert "  attention   flash | naive | sdpa  (default flash): how q,k,v become the attention output" in out
    experiments = " | ".join(sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml")))
    assert f"  experiment  {experiments}  (default none): a named recipe" in out
    assert "  lr: 6.0e-4                 # peak learning rate, reached after warmup" in out
    assert "experiment=quickstart" in out and "no CUDA device" not in out


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data=text", "data.paths=[nowhere/*.txt]"], "config error: data=text: data.paths: no file matches ['nowhere/*.txt']"),
        (["data=synthetic", "data.num_tokens=20"], "config error: data=synthetic: corpus too small for seq_len=32: the train split has 20 tokens"),
    ],
)
def test_a_data_error_is_one_line_and_exit_code_2(tiny_cfg, monkeypatch, caplog, overrides, message):
    import train as entry  # train.py

    monkeypatch.setattr(entry.HydraConfig, "get", lambda: SimpleNamespace(mode=entry.RunMode.RUN))
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exit_:
        entry.main.__wrapped__(tiny_cfg(*overrides))
    assert exit_.value.code == 2
    assert message in caplog.text and "Traceback" not in caplog.text


SIMULATED_OOM = """
import sys
import torch
import training.loop
from model.attention import naive_attention
real_step = training.loop.train_step

def train_step(model, *args, **kwargs):
    attend = model.blocks[0].attn.attend
    if getattr(attend, "func", attend) is naive_attention:  # attention=naive: a partial (its window bound)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 288.00 GiB")
    return real_step(model, *args, **kwargs)

training.loop.train_step = train_step
sys.argv = ["train.py", *sys.argv[1:]]
import runpy
runpy.run_path("train.py", run_name="__main__")  # as `python train.py ...` (Hydra finds configs/ by the file)
"""


def test_oom_exits_nonzero_alone(tiny_cfg, pattern_data, monkeypatch, caplog):
    """train.py's main() on a single run (Hydra's mode RUN): the summary says oom, the exit code is 1."""
    import train as entry  # train.py

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 288.00 GiB")

    monkeypatch.setattr("training.loop.train_step", oom)
    monkeypatch.setattr(entry.HydraConfig, "get", lambda: SimpleNamespace(mode=entry.RunMode.RUN))
    cfg = tiny_cfg("attention=naive")
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exit_:
        entry.main.__wrapped__(cfg)
    assert exit_.value.code == 1
    assert "out of GPU memory: attention=naive model=tiny seq_len=32 batch_size=4 (micro-batch 4)." in caplog.text
    assert "4×2×32² scores: 32.0 KiB per matrix in float32, and the backward needs 32.0 KiB" in caplog.text
    assert json.loads((Path(cfg.out_dir) / SUMMARY_FILE).read_text())["status"] == "oom"


@pytest.mark.slow
def test_oom_in_a_sweep_is_recorded_and_the_next_job_runs(tmp_path):
    """`python train.py -m attention=naive,sdpa` where naive runs out of memory: exit 0, both jobs recorded."""
    overrides = [*SHRINK, "steps=2", "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000"]
    sweep = subprocess.run(
        [sys.executable, "-c", SIMULATED_OOM, "-m", "attention=naive,sdpa", *overrides,
         f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "out of GPU memory: attention=naive model=tiny seq_len=32" in sweep.stdout + sweep.stderr
    assert "Traceback" not in sweep.stdout + sweep.stderr
    jobs = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    status = {p.name: json.loads((p / SUMMARY_FILE).read_text())["status"] for p in jobs}
    assert status == {"0-naive-tiny-n32": "oom", "1-sdpa-tiny-n32": "ok"}
