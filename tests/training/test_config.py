"""configs/, training/schema.py and training/config.py: composition, every group option typed, checks."""

import dataclasses
import re

import pytest
from conftest import CONFIGS, REPO, compose_config
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from training import schema
from training.config import ConfigError, validate_config
from training.metrics import attention_label

GROUPS = ["attention", "model", "data", "logger", "experiment"]


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
    [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))],
)
def test_every_option_composes_validates_and_is_typed(group, option):
    cfg = compose_config(f"{group}={option}")
    validate_config(cfg)
    assert OmegaConf.get_type(cfg) is schema.TrainConfig
    if group != "experiment":
        assert cfg[group].name == option
        typed = OmegaConf.get_type(cfg[group])  # the schema the option's defaults list names
        assert dataclasses.is_dataclass(typed) and typed.__module__ == schema.__name__, typed
        assert {f.name for f in dataclasses.fields(typed)} == set(cfg[group]), "schema and YAML list the same keys"


def test_sdpa_backend_override():
    cfg = compose_config("attention=sdpa", "attention.backend=cudnn")
    validate_config(cfg)
    assert cfg.attention.backend == "cudnn"


def test_flash_deterministic_defaults_auto_and_true_gets_its_own_label():
    cfg = compose_config()
    validate_config(cfg)
    assert cfg.attention.deterministic == "auto" and attention_label(cfg) == "flash"
    assert attention_label(compose_config("attention.deterministic=false")) == "flash"
    cfg = compose_config("attention.deterministic=true")
    validate_config(cfg)
    assert attention_label(cfg) == "flash_two_pass"  # run names tell the forced two-pass backward apart


def test_every_key_has_a_comment():
    """The YAML comments are the keys' only reference (README points to them); ~10 ms for all files."""
    uncommented = []
    for path in sorted(CONFIGS.rglob("*.yaml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            is_key = re.match(r"^\s*(- )?[\w@]+:", line) or re.match(r"^\s*- (\w+: |/)", line)  # keys, group and schema entries
            if is_key and not line.rstrip().endswith(":") and "#" not in line:  # headers (hydra:, defaults:) excepted
                uncommented.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not uncommented, uncommented


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
        (["lr=0"], "lr must be > 0 (got 0.0)"),  # a float: the schema converts
        (["min_lr=1"], "min_lr must be in [0, lr=0.0006] (got 1.0)"),
        (["dtype=fp16"], "dtype must be auto, bf16 or fp32 (got 'fp16')"),
        (["device=tpu"], "device must be auto, cpu or cuda (got 'tpu')"),
        (
            ["attention=sdpa", "attention.backend=fast"],
            "attention.backend must be one of auto, cudnn, flash, efficient, math (got 'fast')",
        ),
        (["attention.name=flashy"], "attention.name='flashy' is unknown; choose one of naive, sdpa, flash"),
        (["attention.window=0"], "attention.window must be null or >= 1 (tokens each query sees, itself included), got 0"),
        (["data=synthetic", "data.document_mask=true"],
         "data.document_mask=true needs a tokenised corpus: synthetic ids hold no <|endoftext|> boundaries"),
        (["data.reset_positions=true"], "data.reset_positions=true needs data.document_mask=true"),
        (["context_parallel=2", "attention.window=64"],
         "context_parallel=2 runs the plain causal mask: set data.document_mask=false and attention.window=null"),
        (["attention.deterministic=maybe"], "attention.deterministic must be auto, true or false (got 'maybe')"),
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


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["seq_length=64"], "seq_length"),
        (["lr=abc"], "lr"),
        (["seq_len=1.5"], "seq_len"),
        (["model.dropout=none"], "model.dropout"),
        (["data.max_files=x"], "data.max_files"),
        (["profile=maybe"], "profile"),
        (["logger=none", "logger.project=x"], "logger.project"),  # a key only another option of the group has
    ],
)
def test_unknown_key_or_wrong_type_is_hydras_error(overrides, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(*overrides)
    assert err.value.__cause__.full_key == key
