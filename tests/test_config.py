"""configs/ and training/config.py: composition, every group option, comments, one-line errors."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from conftest import CONFIGS, REPO, compose_config
from training.config import ConfigError, validate_config
from training.metrics import attention_label

OWN_GROUPS = ["attention", "model", "logger", "experiment"]  # configs/data/ belongs to data/


def test_defaults_are_gpt2_medium_with_flash():
    cfg = compose_config()
    validate_config(cfg)
    assert cfg.attention.name == "flash"
    assert (cfg.model.name, cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd) == ("gpt2-medium", 24, 16, 1024)
    assert cfg.model.n_embd // cfg.model.n_head == 64 and cfg.model.vocab_size == 50304
    assert cfg.data.name == "stdlib"
    assert (cfg.logger.name, cfg.logger.mode) == ("wandb", "offline")
    assert (cfg.dtype, cfg.compile, cfg.device) == ("auto", "auto", "auto")


@pytest.mark.parametrize("seq_len,batch", [(1024, 16), (8192, 2), (64, 256)])
def test_null_batch_size_keeps_tokens_per_step(seq_len, batch):
    cfg = compose_config(f"seq_len={seq_len}")
    validate_config(cfg)
    assert cfg.batch_size == batch and cfg.batch_size * cfg.seq_len == cfg.tokens_per_step


@pytest.mark.parametrize(
    "group,option",
    [(g, p.stem) for g in OWN_GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))],
)
def test_every_option_composes_and_validates(group, option):
    cfg = compose_config(f"{group}={option}")
    validate_config(cfg)
    if group != "experiment":
        assert cfg[group].name == option


def test_sdpa_backend_override():
    cfg = compose_config("attention=sdpa", "attention.backend=cudnn")
    validate_config(cfg)
    assert cfg.attention.backend == "cudnn"


def test_flash_deterministic_defaults_true_and_false_gets_its_own_label():
    cfg = compose_config()
    validate_config(cfg)
    assert cfg.attention.deterministic is True and attention_label(cfg) == "flash"
    cfg = compose_config("attention.deterministic=false")
    validate_config(cfg)
    assert attention_label(cfg) == "flash-fused"  # run names tell the two backward schedules apart


@pytest.mark.parametrize("path", [p for g in [".", *OWN_GROUPS] for p in sorted((CONFIGS / g).glob("*.yaml"))], ids=str)
def test_every_key_has_a_comment(path: Path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        is_key = re.match(r"^\s*(- )?[\w@]+:", line) or re.match(r"^\s*- \w+: ", line)
        if is_key and not line.rstrip().endswith(":"):  # mapping headers (hydra:, defaults:) group commented keys
            assert "#" in line, f"{path.relative_to(REPO)}:{n} has no comment: {line.strip()}"


def test_experiments_show_their_command():
    for path in (CONFIGS / "experiment").glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("# @package _global_"), path.name
        assert f"python train.py experiment={path.stem}" in text, f"{path.name}: header lacks its command"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["seq_len=0"], "seq_len must be a positive integer (got 0)"),
        (["seq_len=-5"], "seq_len must be a positive integer (got -5)"),
        (["batch_size=0"], "batch_size must be a positive integer (got 0)"),
        (["seq_len=1000"], "tokens_per_step=16384 is not a multiple of seq_len=1000; set batch_size instead"),
        (["batch_size=6", "grad_accum=4"], "batch_size=6 must be divisible by grad_accum=4"),
        (["model.n_head=12"], "model.n_head=12 must divide model.n_embd=1024"),
        (["model.n_layer=0"], "model.n_layer must be a positive integer (got 0)"),
        (["steps=0"], "steps must be a positive integer (got 0)"),
        (["stop_at=2000"], "stop_at must be in 1..steps=1000 or null (got 2000)"),
        (["lr=0"], "lr must be > 0 (got 0)"),
        (["min_lr=1"], "min_lr must be in [0, lr=0.0006] (got 1)"),
        (["dtype=fp16"], "dtype must be auto, bf16 or fp32 (got 'fp16')"),
        (["device=tpu"], "device must be auto, cpu or cuda (got 'tpu')"),
        (
            ["attention=sdpa", "attention.backend=fast"],
            "attention.backend must be one of auto, cudnn, flash, efficient, math (got 'fast')",
        ),
        (["attention.name=flashy"], "attention.name='flashy' is unknown; choose one of naive, sdpa, flash"),
        (["attention.deterministic=maybe"], "attention.deterministic must be true or false (got 'maybe')"),
    ],
)
def test_invalid_values_name_the_field(overrides, message):
    cfg = compose_config(*overrides)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert str(err.value) == message


def test_unknown_attention_is_hydras_error():
    with pytest.raises(MissingConfigException, match=r"Could not find 'attention/flashy'") as err:
        compose_config("attention=flashy")
    assert all(name in str(err.value) for name in ("naive", "sdpa", "flash"))  # lists the options


def test_unknown_key_is_hydras_error():
    with pytest.raises(ConfigCompositionException, match="seq_length"):
        compose_config("seq_length=64")


def test_cli_config_error_is_one_line(tmp_path):
    """Through train.py: exit code 2, the field named, no traceback, before any data or model work."""
    result = subprocess.run(
        [sys.executable, "train.py", "seq_len=0", f"hydra.run.dir={tmp_path}", f"cache_dir={tmp_path / 'cache'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "config error: seq_len must be a positive integer (got 0)" in output
    assert "Traceback" not in output
    assert not (tmp_path / "cache").exists()  # failed before touching the data
